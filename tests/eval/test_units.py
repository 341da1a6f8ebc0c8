"""eval/ pieces that need no trained model: metrics sums, file windows, sampling, best lr.

References are float64 NumPy computations written out independently of eval/.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eval import common, generate, perplexity, recall, report


class CharCodec:
    """A tiny character tokenizer: ids are positions in a fixed alphabet (one has 2 UTF-8
    bytes)."""

    alphabet = "abc é\n"

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids)


def bigram_stats_fn(table):
    """stats_fn of a bigram model whose logits at position t are table[inputs[t]]."""
    def stats(batch):
        logits = table[np.asarray(batch["inputs"])]
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        t = np.asarray(batch["targets"])
        nll = -np.take_along_axis(logp, t[..., None], -1)[..., 0]
        return nll, logits.argmax(-1) == t
    return stats


def test_file_batches_cover_every_token_once(tmp_path):
    codec = CharCodec()
    texts = ["abcab é\nabc", "cba"]
    for i, t in enumerate(texts):
        (tmp_path / f"f{i}.txt").write_text(t, encoding="utf-8")
    batches = list(perplexity.file_batches(str(tmp_path / "*.txt"), codec.encode, seq_len=4,
                                           batch_size=3))
    assert all(b["inputs"].shape == (3, 4) for b in batches)
    targets = [int(x) for b in batches for x in b["targets"][b["mask"] > 0]]
    # every token but the first of each file is a target exactly once, in order
    want = codec.encode(texts[0])[1:] + codec.encode(texts[1])[1:]
    assert targets == want
    # inputs are the tokens right before the targets, and padding has segment id 0
    for b in batches:
        m = b["mask"] > 0
        assert np.all(b["segment_ids"][m] == 1) and np.all(b["segment_ids"][~m] == 0)


def test_file_batches_clear_error_on_no_match(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no file"):
        list(perplexity.file_batches(str(tmp_path / "*.nothing"), str.encode, 4, 2))


def test_evaluate_matches_float64_reference(tmp_path):
    codec = CharCodec()
    rng = np.random.default_rng(0)
    table = rng.normal(size=(len(codec.alphabet), len(codec.alphabet)))
    text = "abé cab\nccé ab" * 3
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    batches = list(perplexity.file_batches(str(tmp_path / "t.txt"), codec.encode, 8, 2))
    r = perplexity.evaluate(bigram_stats_fn(table), batches, perplexity.byte_counter(codec))
    # reference: mean NLL of every next character under the bigram table
    ids = codec.encode(text)
    logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
    nll = [-logp[a, b] for a, b in zip(ids[:-1], ids[1:])]
    assert r["tokens"] == len(ids) - 1
    assert r["loss"] == pytest.approx(np.mean(nll), rel=1e-12)
    assert r["perplexity"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-12)
    nbytes = len(text[1:].encode("utf-8"))  # targets spell the text after its first char
    assert r["bytes"] == nbytes
    assert r["bits_per_byte"] == pytest.approx(np.sum(nll) / (math.log(2) * nbytes),
                                               rel=1e-12)


def test_masked_accuracy_and_example_scores():
    table = np.eye(4) * 5.0  # predicts "same token again"
    stats = bigram_stats_fn(table)
    batch = {"inputs": np.array([[0, 1, 2, 3], [3, 3, 1, 0]]),
             "targets": np.array([[0, 2, 2, 3], [3, 3, 1, 1]]),
             "mask": np.array([[1, 1, 1, 0], [0, 1, 1, 1]], np.float32)}
    correct, total = recall.masked_accuracy(stats, [batch])
    # row 0: hits at 0 and 2 (masked), miss at 1; row 1: hits at 1, 2, miss at 3
    assert (correct, total) == (4, 6)
    exact, frac = recall.example_scores(stats, batch)
    np.testing.assert_allclose(exact, [0.0, 0.0])
    np.testing.assert_allclose(frac, [2 / 3, 2 / 3])
    batch["targets"][0, 1] = 1
    exact, _ = recall.example_scores(stats, batch)
    np.testing.assert_allclose(exact, [1.0, 0.0])


def test_default_mqar_settings_bound_kv_by_quarter_length():
    s = recall.default_mqar_settings([64, 128])
    assert s == [(64, 4), (64, 8), (64, 16), (128, 4), (128, 8), (128, 16), (128, 32)]


def test_sample_logits_greedy_and_top_k():
    logits = jnp.array([[0.1, 2.0, 1.9, -1.0], [3.0, 0.0, 0.0, 2.9]])
    key = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(generate.sample_logits(logits, key, 0.0, 0), [1, 0])
    np.testing.assert_array_equal(generate.sample_logits(logits, key, 1.0, 1), [1, 0])
    # top-2 sampling never leaves the two largest logits, and visits both
    draws = np.asarray(jax.vmap(lambda k: generate.sample_logits(logits, k, 1.0, 2))(
        jax.random.split(key, 200)))
    assert set(draws[:, 0]) == {1, 2} and set(draws[:, 1]) == {0, 3}
    # at temperature 1 with all tokens, frequencies follow the softmax (4 sigma band)
    probs = np.exp(np.asarray(logits[0], np.float64))
    probs /= probs.sum()
    draws = np.asarray(jax.vmap(lambda k: generate.sample_logits(logits[:1], k, 1.0, 0))(
        jax.random.split(key, 4000)))[:, 0]
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert np.all(np.abs(freq - probs)
                  < 4 * np.sqrt(probs * (1 - probs) / len(draws)) + 1e-3)


def test_cache_nbytes_counts_every_leaf():
    cache = {"a": jnp.zeros((2, 3), jnp.float32),
             "b": [jnp.zeros(5, jnp.int32), jnp.zeros((), jnp.bfloat16)]}
    assert generate.cache_nbytes(cache) == 2 * 3 * 4 + 5 * 4 + 2


def _rec(mixer, lr, seed, value, task="mqar", setting="T64", size="d64"):
    key = report.primary(task)[0]
    return {"task": task, "setting": setting, "mixer": mixer, "size": size, "lr": lr,
            "seed": seed, "metrics": {key: value}, "state_size": 100}


def test_best_lr_averages_seeds_and_skips_diverged():
    recs = [_rec("a", 1e-3, 0, 0.9), _rec("a", 1e-3, 1, 0.5),   # mean 0.7
            _rec("a", 1e-2, 0, 0.8), _rec("a", 1e-2, 1, 0.7),   # mean 0.75 -> best
            _rec("a", 1e-1, 0, float("nan")),                    # diverged: never best
            _rec("b", 1e-3, 0, 2.0, task="lm"), _rec("b", 1e-2, 0, 1.5, task="lm")]
    best = report.best_lr(recs)
    assert best[("mqar", "T64", "a", "d64")]["lr"] == 1e-2
    assert best[("mqar", "T64", "a", "d64")]["value"] == pytest.approx(0.75)
    assert best[("lm", "T64", "b", "d64")]["lr"] == 1e-2  # lower loss wins for lm
    md = report.markdown(recs, title="t", settings_order=["T64"])
    assert "0.750 (lr 0.01)" in md


def test_niah_summary_reports_the_training_length_separately():
    """Exact match at the training length is the mean over depths at that length only;
    the grid mean covers every length; two seeds average."""
    def cells(at_train, longer):
        return {"train_length": 512, "cells": [
            {"length": 512, "depth": 0.0, "exact": at_train[0]},
            {"length": 512, "depth": 1.0, "exact": at_train[1]},
            {"length": 1024, "depth": 0.0, "exact": longer},
            {"length": 1024, "depth": 1.0, "exact": longer}]}

    def rec(seed, at_train, longer, multikey):
        grid, grid_mk = cells(at_train, longer), cells(multikey, 0.0)
        mean = lambda g: sum(c["exact"] for c in g["cells"]) / 4  # noqa: E731
        return {"task": "niah", "setting": "L512", "mixer": "hybrid", "size": "d256",
                "lr": 1e-3, "seed": seed, "state_size": 7,
                "metrics": {"exact": mean(grid), "grid": grid, "grid_multikey": grid_mk,
                            "exact_multikey": mean(grid_mk)}}

    recs = [rec(0, (1.0, 0.5), 0.0, (0.5, 0.5)), rec(1, (1.0, 1.0), 0.5, (1.0, 1.0))]
    table = report.niah_summary_table(report.best_lr(recs))
    row = table.splitlines()[2].strip("| ").split(" | ")
    # @train: passkey (0.75 + 1.0) / 2, multi-key (0.5 + 1.0) / 2; grid: (0.375 + 0.75) / 2
    assert row[6:10] == ["0.875", "0.750", "0.562", "0.375"]
    assert "| 512 |" in table


def _oracle_mqar_stats(window_pairs):
    """An MQAR 'model' that remembers only the last `window_pairs` key-value pairs of the
    context (a sliding window): right at a query iff its key is among them."""
    def stats(batch):
        inp, tgt = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
        pred = np.zeros_like(tgt)
        for r in range(len(inp)):
            ctx = 2 * int(np.asarray(batch["kv"])[r])
            keys, vals = inp[r, 0:ctx:2], inp[r, 1:ctx:2]
            memory = dict(zip(keys[-window_pairs:], vals[-window_pairs:]))
            for t in range(ctx, inp.shape[1]):
                pred[r, t] = memory.get(inp[r, t], -1)
        return np.zeros(tgt.shape), pred == tgt
    return stats


def test_mqar_grid_accuracy_of_a_sliding_window_oracle(monkeypatch):
    from data import mqar

    settings = [(32, 4), (64, 8)]
    real_generate = mqar.generate

    def generate_with_kv(rng, n, t, kv, *a, **k):  # let the oracle see kv per row
        ex = real_generate(rng, n, t, kv, *a, **k)
        ex["kv"] = np.full(n, kv)
        return ex

    monkeypatch.setattr(mqar, "generate", generate_with_kv)
    task = {"vocab_size": 128, "offset": 0, "power_a": 0.01}
    got = recall.mqar_grid(_oracle_mqar_stats(3), task, settings, num_examples=20,
                           batch_size=7, progress=False)
    for cell, (t, kv) in zip(got["cells"], settings):
        # reference: every key is queried once, so accuracy = remembered / kv pairs
        assert cell["queries"] == 20 * kv
        assert cell["accuracy"] == pytest.approx(3 / kv, abs=1e-12)


def test_niah_grid_of_a_half_context_oracle():
    """An oracle that gets the digits right iff the needle is in the first half of the
    input: the grid must show exact = 1 exactly where generate put it there."""
    from data import niah

    def gen(length, depth, n, seed):
        ex = niah.generate(np.random.default_rng(seed), n, length, depth, base_vocab=40)
        ex["segment_ids"] = np.ones_like(ex["inputs"])
        return ex

    def stats(batch):
        inp, tgt = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
        pos = (inp == 40).argmax(1)  # [NEEDLE] is id base_vocab
        ok = pos < inp.shape[1] / 2
        return np.zeros(tgt.shape), np.where(ok[:, None], True, np.zeros_like(tgt, bool))

    config = {"data": {"seq_len": 32}}
    got = recall.niah_grid(stats, config, None, length_multiples=(1, 2), num_depths=5,
                           num_examples=3, batch_size=2, generate_fn=gen)
    assert [(c["length"], c["depth"]) for c in got["cells"]] == \
        [(n, d) for n in (32, 64) for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
    for i, c in enumerate(got["cells"]):
        ref = gen(c["length"], c["depth"], 3, 4321 + i)
        want = float(np.mean(ref["needle_pos"] < c["length"] / 2))
        assert c["exact"] == want and c["per_digit"] == want
    assert got["exact"] == pytest.approx(np.mean([c["exact"] for c in got["cells"]]))
    assert {c["exact"] for c in got["cells"]} == {0.0, 1.0}  # both cases occur


def test_lm_runs_are_judged_by_their_best_val_loss():
    """An early-stopped run's final loss is of overfit parameters: the best during
    training decides the lr and the table's order; a run with no evaluation during
    training falls back to its final val_loss."""
    def lm(mixer, lr, best, final):
        metrics = {"val_loss": final} if best is None else {"val_loss": final,
                                                            "best_val_loss": best}
        return {"task": "lm", "setting": "char", "mixer": mixer, "size": "d", "lr": lr,
                "seed": 0, "metrics": metrics, "layers": 2, "params": 1, "state_size": 1}
    recs = [lm("a", 1e-3, 1.50, 2.00), lm("a", 1e-2, 1.60, 1.70),   # best 1.50 at 1e-3
            lm("b", 1e-3, None, 1.55)]                                # fallback: 1.55
    best = report.best_lr(recs)
    assert best[("lm", "char", "a", "d")]["lr"] == 1e-3
    assert best[("lm", "char", "b", "d")]["value"] == pytest.approx(1.55)
    table = report.lm_table(recs, best)
    rows = [line for line in table.splitlines()
            if line.startswith("| a") or line.startswith("| b")]
    assert [r.split("|")[1].strip() for r in rows] == ["a", "b"]   # 1.50 before 1.55
    assert "1.500" in rows[0] and "2.000" in rows[0]                # best, then at the stop


def test_lm_table_marks_ties_by_the_seeds_intervals():
    """Lower loss is better: the lowest mean is [best]; a mixer whose 95% interval
    overlaps it is [tie]; one whose interval lies above it is unmarked; one seed is [?].
    Beside it, the 95% prediction interval of one more seed."""
    def lm(mixer, seed, best):
        return {"task": "lm", "setting": "char", "mixer": mixer, "size": "d", "lr": 1e-3,
                "seed": seed, "metrics": {"val_loss": best, "best_val_loss": best},
                "layers": 2, "params": 1, "state_size": 1}
    losses = {"a": [1.46, 1.47, 1.48], "b": [1.47, 1.48, 1.49], "c": [1.60, 1.61, 1.62],
              "d": [1.50]}
    recs = [lm(m, i, v) for m, vals in losses.items() for i, v in enumerate(vals)]
    table = report.lm_table(recs, report.best_lr(recs))
    row = {line.split("|")[1].strip(): line for line in table.splitlines()
           if line.startswith("| ") and not line.startswith("| mixer")}
    assert "(n 3) [best]" in row["a"] and "(n 3) [tie]" in row["b"]
    assert "[" not in row["c"].split("|")[8]
    assert "[?]" in row["d"]
    # where a new seed should land: mean +- t(0.975, 2) * s * sqrt(1 + 1/3), s = 0.01
    half = 4.302653 * 0.01 * (4 / 3) ** 0.5
    assert row["a"].split("|")[9].strip() == f"[{1.47 - half:.3f}, {1.47 + half:.3f}]"
    assert row["d"].split("|")[9].strip() == "-"


def test_loss_curves_draw_the_seeds_mean_and_spread(monkeypatch, tmp_path):
    """Several seeds of a mixer: one line at their mean over the seeds that reached each
    step (early stops differ), a band from the lowest to the highest; one run: its line."""
    from eval import plots
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    seeds = [[(250, 2.0), (500, 1.0)], [(250, 4.0), (500, 3.0), (750, 2.5)]]
    assert plots.seed_band(seeds) == [(250, 3.0, 2.0, 4.0, 2), (500, 2.0, 1.0, 3.0, 2),
                                      (750, 2.5, 2.5, 2.5, 1)]
    plots.loss_curves({"a": seeds, "b": [[(250, 5.0), (500, 4.0)]], "c": [[]]},
                      str(tmp_path / "x.png"))
    (fig,) = figs
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"a (mean of 2 seeds, min-max)", "b"}
    a = lines["a (mean of 2 seeds, min-max)"]
    assert list(a.get_xdata()) == [250, 500, 750] and list(a.get_ydata()) == [3.0, 2.0, 2.5]
    (band,) = ax.collections                      # only the mixer with several seeds
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == 1.0 and max(ys) == 4.0


def test_loss_curves_style_every_line_apart(monkeypatch, tmp_path):
    """Thirteen mixers (tiny-Shakespeare's table): no two lines share colour and dash,
    so the legend names one line each (matplotlib's cycle repeats after ten colours)."""
    from eval import plots
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    plots.loss_curves({f"m{i:02d}": [[(250, 2.0 + i), (500, 1.0 + i)]] for i in range(13)},
                      str(tmp_path / "x.png"))
    (ax,) = figs[0].axes
    styles = {(tuple(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}
    assert len(styles) == 13


def test_recall_scatter_draws_reference_points(monkeypatch, tmp_path):
    """Published points (Zoology's, from the MQAR config) are drawn on every panel at
    their (state size, accuracy), beside the measured curves."""
    from eval import plots
    from tests.eval.conftest import load_compare_config
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    refs = [dict(r) for r in load_compare_config("compare_mqar")["references"]]
    assert {r["mixer"] for r in refs} >= {"taylor", "gated_deltanet", "deltanet"}
    pts = [{"setting": s, "mixer": "based", "state_size": 5e4 * (i + 1),
            "value": 0.5 + 0.1 * i} for s in ("T64", "T256") for i in range(2)]
    plots.recall_vs_state(pts, str(tmp_path / "x.png"), references=refs)
    (fig,) = figs
    for ax in fig.axes:
        drawn = {(float(line.get_xdata()[0]), float(line.get_ydata()[0])): line.get_label()
                 for line in ax.get_lines() if line.get_marker() == "*"}
        assert drawn == {(r["state_size"], r["value"]):
                         f"{r.get('label', r['mixer'])} (Zoology, 7-setting mean, approx.)"
                         for r in refs}
        measured = [line for line in ax.get_lines() if line.get_marker() == "o"]
        assert len(measured) == 1 and list(measured[0].get_ydata()) == [0.5, 0.6]


def test_step_flag_values():
    assert common.parse_step("latest") is None and common.parse_step(None) is None
    assert common.parse_step("best") == "best" and common.parse_step("12") == 12
    with pytest.raises(ValueError, match="--step='newest'"):
        common.parse_step("newest")


def test_models_of_one_architecture_share_one_compiled_forward():
    # A sweep measures its members one after another: each member's logits are its own
    # (its model called directly), from one compilation of the forward.
    from flax import nnx

    from models.config import ModelConfig
    from models.lm import LanguageModel
    cfg = ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2,
                      mixer="gated_deltanet")
    x = np.arange(16, dtype=np.int32).reshape(2, 8) % 32
    forwards = set()
    for seed in (0, 1, 2):
        model = LanguageModel(cfg, rngs=nnx.Rngs(seed))
        expected = model(jnp.asarray(x), deterministic=True)
        logits_fn = common.make_logits_fn(model)
        np.testing.assert_allclose(np.asarray(logits_fn(x)), np.asarray(expected),
                                   rtol=1e-5, atol=1e-5)
        # a row of one segment is the same sequence as a row without segment ids
        np.testing.assert_allclose(np.asarray(logits_fn(x, np.ones_like(x))),
                                   np.asarray(expected), rtol=1e-5, atol=1e-5)
        forwards.add(common._forward_of(nnx.graphdef(model)))
    (forward,) = forwards
    assert forward._cache_size() == 2  # without and with segment ids


def test_token_stats_pass_segment_ids_only_for_packed_rows():
    # As training's loss: a dataset whose rows are one example each (MQAR, NIAH) runs
    # without segment ids; a packed one keeps its documents apart.
    from flax import nnx

    from models.config import ModelConfig
    from models.lm import LanguageModel
    cfg = ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, mixer="softmax")
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    x = (np.arange(24, dtype=np.int32).reshape(2, 12) * 7) % 32
    seg = np.repeat(np.array([[1] * 5 + [2] * 7]), 2, axis=0).astype(np.int32)
    batch = {"inputs": x, "targets": np.roll(x, -1, axis=1), "segment_ids": seg}
    logits_fn = common.make_logits_fn(model)
    whole = np.asarray(model(jnp.asarray(x), deterministic=True), np.float64)
    split = np.asarray(model(jnp.asarray(x), segment_ids=jnp.asarray(seg),
                             deterministic=True), np.float64)

    def nll(logits):  # float64 reference of the per-position loss
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]

    unpacked, _ = common.token_stats_fn(logits_fn, packed=False)(batch)
    packed, _ = common.token_stats_fn(logits_fn, packed=True)(batch)
    np.testing.assert_allclose(unpacked, nll(whole), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed, nll(split), rtol=1e-5, atol=1e-5)
    # the second document's positions see the first only without segment ids
    assert np.abs(unpacked[:, 5:] - packed[:, 5:]).max() > 1e-3
    np.testing.assert_allclose(unpacked[:, :5], packed[:, :5], rtol=1e-5, atol=1e-5)


def test_rows_packed_reads_the_dataset():
    class Rows:
        packed = False
    assert common.rows_packed(Rows()) is False
    assert common.rows_packed(object()) is True  # a run loaded without its corpus
