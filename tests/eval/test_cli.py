"""The eval CLIs on a tiny trained workdir, each against an independent computation.

References: the model's full forward pass (no caches, no eval/ code) with the loss in
float64 NumPy; greedy decoding re-derived by running the full forward on the growing
sequence; MQAR accuracy recomputed from freshly generated examples.
"""
import json
import math
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.eval.conftest import ROOT


@nnx.jit
def _forward(model, inputs, segment_ids):
    return model(inputs, segment_ids=segment_ids, deterministic=True)


def _logits(model, inputs, segment_ids=None):
    """The model's own full forward pass (no decode caches), as float64 NumPy."""
    inputs = jnp.asarray(inputs, jnp.int32)
    seg = (jnp.ones_like(inputs) if segment_ids is None
           else jnp.asarray(segment_ids, jnp.int32))
    return np.asarray(_forward(model, inputs, seg), np.float64)


def _nll_reference(model, batches):
    """Sum of -log p(target) (float64 NumPy) and number of targets, from raw logits."""
    nats, n = 0.0, 0
    for b in batches:
        logits = _logits(model, b["inputs"], b["segment_ids"])
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        targets = b["targets"][..., None].astype(np.int64)
        nll = -np.take_along_axis(logp, targets, -1)[..., 0]
        nats += float((nll * b["mask"]).sum())
        n += int((b["mask"] > 0).sum())
    return nats, n


def test_perplexity_matches_direct_nll(text_run):
    from eval import perplexity
    from training.checkpoint import load_for_eval

    r = perplexity.run(str(text_run), batch_size=4, num_batches=3, progress=False)
    model, config, dataset, step = load_for_eval(str(text_run))
    nats, n = _nll_reference(model, list(dataset.eval_batches(4, 3)))
    assert r["tokens"] == n == 4 * 3 * 32
    assert r["loss"] == pytest.approx(nats / n, rel=1e-5)
    assert r["perplexity"] == pytest.approx(math.exp(r["loss"]), rel=1e-12)
    # ASCII text, byte tokenizer: one byte per target, so bits/byte = loss / ln 2
    assert r["bits_per_byte"] == pytest.approx(nats / (math.log(2) * n), rel=1e-5)
    assert r["loss"] < math.log(256) - 1.0  # it did learn something in 30 steps
    assert r["step"] == 30


def test_perplexity_files_flag(text_run, tmp_path):
    """--files: the text cut into windows; bytes counted from the decoded targets."""
    from eval import perplexity
    from training.checkpoint import load_for_eval

    text = "the queen shall speak of war and love\n" * 5 + "naïve café\n"  # 2-byte chars
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    r = perplexity.run(str(text_run), files=str(tmp_path / "*.txt"), batch_size=4,
                       progress=False)
    model, config, dataset, _ = load_for_eval(str(text_run))
    ids = dataset.tokenizer.encode(text)
    batches = list(perplexity.file_batches(str(tmp_path / "*.txt"),
                                           dataset.tokenizer.encode, 32, 4))
    nats, n = _nll_reference(model, batches)
    assert n == r["tokens"] == len(ids) - 1
    # every byte but the first is a target
    assert r["bytes"] == len(text.encode("utf-8")) - 1
    assert r["loss"] == pytest.approx(nats / n, rel=1e-5)
    assert r["bits_per_byte"] == pytest.approx(nats / (math.log(2) * r["bytes"]), rel=1e-5)


def test_perplexity_cli_prints_json_last(text_run):
    out = subprocess.run([sys.executable, "-m", "eval.perplexity", f"--workdir={text_run}",
                          "--batch_size=4", "--num_batches=2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"loss", "perplexity", "bits_per_byte", "tokens"} <= set(last)
    assert last["perplexity"] == pytest.approx(math.exp(last["loss"]))
    assert last["tokens"] == 2 * 4 * 32


def test_perplexity_cli_missing_workdir_message(tmp_path):
    from eval import perplexity

    with pytest.raises(FileNotFoundError, match="does not exist: pass the --workdir"):
        perplexity.run(str(tmp_path / "nope"))


def test_greedy_generation_equals_repeated_full_forward(text_run):
    from eval import generate
    from training.checkpoint import load_for_eval

    model, _, dataset, _ = load_for_eval(str(text_run))
    prompt = np.asarray([dataset.tokenizer.encode("the king shall ")], np.int32)
    n = 12
    out = generate.generate(model, prompt, n, temperature=0.0)
    toks = out["tokens"][0]
    seq = prompt[0].tolist()
    p = len(seq)
    for i in range(n):  # reference: argmax of the cache-free forward on the sequence so far
        # one compiled shape: pad to the final length; causality keeps position p+i-1 exact
        padded = np.zeros((1, p + n), np.int32)
        padded[0, :len(seq)] = seq
        logits = _logits(model, padded)[0, p + i - 1]
        best = int(logits.argmax())
        # equal, or a float tie within 1e-4 nats between two tokens
        assert toks[i] == best or logits[best] - logits[toks[i]] < 1e-4, (i, toks[i], best)
        seq.append(int(toks[i]))
    assert out["tokens_per_s"] > 0


def test_generate_cli_text_and_state_bytes(text_run):
    from eval import generate

    r = generate.run(str(text_run), "the queen", 8, temperature=0.0)
    r16 = generate.run(str(text_run), "the queen", 24, temperature=0.8, top_k=5, seed=3)
    assert len(r["text"].encode("utf-8", "replace")) >= 1
    # gated_deltanet: the decode state is the same size whatever the generated length
    assert r["state_bytes"] == r16["state_bytes"] > 0


def test_decode_state_bytes_constant_for_gated_deltanet_grow_for_softmax():
    from eval import generate
    from models.config import ModelConfig
    from models.lm import LanguageModel

    sizes = {}
    for mixer in ("gated_deltanet", "softmax"):
        m = LanguageModel(ModelConfig(vocab_size=16, d_model=16, num_layers=1, num_heads=2,
                                      mixer=mixer, mlp=False), rngs=nnx.Rngs(0))
        sizes[mixer] = [generate.cache_nbytes(m.init_cache(1, 5 + n)) for n in (2, 10)]
    assert sizes["gated_deltanet"][0] == sizes["gated_deltanet"][1]
    # softmax: a KV cache per position, 8 more positions of k and v (2 x 16 floats each)
    assert sizes["softmax"][1] - sizes["softmax"][0] == 8 * 2 * 16 * 4


def test_mqar_recall_equals_direct_computation(mqar_run):
    from data import mqar
    from eval import recall
    from training.checkpoint import load_for_eval

    run_dir = str(mqar_run)
    r = recall.run(run_dir, "mqar", seq_lens=(16, 32), num_examples=24, batch_size=8)
    assert [(c["seq_len"], c["kv_pairs"]) for c in r["cells"]] == \
        [(16, 4), (32, 4), (32, 8)]
    model, config, dataset, _ = load_for_eval(run_dir)
    for c in r["cells"]:
        ex = mqar.generate(np.random.default_rng([1234, c["seq_len"], c["kv_pairs"]]), 24,
                           c["seq_len"], c["kv_pairs"], 64, 0.01)
        logits = _logits(model, ex["inputs"])
        hit = logits.argmax(-1) == ex["targets"]
        m = ex["mask"] > 0
        assert c["queries"] == m.sum() == 24 * c["kv_pairs"]
        assert c["accuracy"] == pytest.approx(hit[m].mean(), abs=1e-12)
    saved = json.loads(open(os.path.join(run_dir, "recall_mqar.json")).read())
    assert saved["cells"] == r["cells"]
