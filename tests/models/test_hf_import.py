"""models.hf: Hugging Face checkpoints in and out, against transformers' own logits.

The fixtures (tests/fixtures/hf/<family>/) are tiny random-weight models that
scripts/make_hf_fixtures.py built from transformers' config classes, with the float32
logits transformers computed on input_ids.npy; these tests need neither torch nor
transformers. Metric: max |ours - transformers'| / max |transformers'| over all logits
(an elementwise relative error is meaningless at logits near 0), at most 1e-4.
"""
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import LanguageModel, ModelConfig, hf, hf_config

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
FAMILIES = ("llama", "mistral", "qwen2", "gpt2")
TOLERANCE = 1e-4


@nnx.jit
def logits_of(model, ids):
    return model(ids)


@nnx.jit
def _prefill(model, ids, cache):
    return model.prefill(ids, cache)


@nnx.jit
def _decode(model, token, cache):
    return model.decode_step(token, cache)


def rel_err(ours, ref) -> float:
    return float(np.abs(np.asarray(ours) - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def imported():
    return {f: hf.load(FIXTURES / f) for f in FAMILIES}


def _io(family):
    return np.load(FIXTURES / family / "input_ids.npy"), np.load(FIXTURES / family /
                                                                 "logits.npy")


@pytest.mark.parametrize("family", FAMILIES)
def test_imported_logits_equal_transformers(imported, family):
    ids, ref = _io(family)
    err = rel_err(logits_of(imported[family], ids), ref)
    assert err < TOLERANCE, f"{family}: max relative error {err:.2e}"


def test_imported_blocks_are_the_families():
    """What each fixture exercises is what the config maps to."""
    cfgs = {f: hf.model_config(FIXTURES / f) for f in FAMILIES}
    assert cfgs["llama"].rope_scaling == "llama3" and cfgs["llama"].resolved_kv_heads == 1
    assert not cfgs["llama"].tie_embeddings
    assert cfgs["mistral"].layer_mixers() == ["sliding_window"] * 2
    assert cfgs["mistral"].window == 8  # shorter than the 16-token input
    assert cfgs["qwen2"].qkv_bias and not cfgs["qwen2"].o_bias
    assert cfgs["qwen2"].rope_theta == 1e6 and cfgs["qwen2"].tie_embeddings
    g = cfgs["gpt2"]
    assert (g.positions, g.norm, g.mlp_type, g.qkv_bias, g.o_bias, g.mlp_bias) == (
        "learned", "layernorm", "gelu_tanh", True, True, True)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_imported_decode_equals_full_sequence(imported, family):
    """Prefill 6 tokens, then decode one at a time: learned positions, the sliding
    window's ring buffer and scaled RoPE give the full call's logits."""
    ids, ref = _io(family)
    model = imported[family]
    cache = model.init_cache(ids.shape[0], 32)
    logits, cache = _prefill(model, jnp.asarray(ids[:, :6]), cache)
    outs = [np.asarray(logits)]
    for t in range(6, ids.shape[1]):
        step, cache = _decode(model, jnp.asarray(ids[:, t]), cache)
        outs.append(np.asarray(step)[:, None])
    assert rel_err(np.concatenate(outs, axis=1), ref) < TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_export_writes_the_checkpoint_transformers_wrote(imported, family, tmp_path):
    """Exported: the same tensor names, shapes and values as transformers'
    save_pretrained wrote, a config.json that imports to the same ModelConfig, and our
    loader reads it back to the same logits."""
    written = hf.save(imported[family], tmp_path)
    assert written == family
    theirs, ours = hf.read_tensors(FIXTURES / family), hf.read_tensors(tmp_path)
    theirs = {k: v for k, v in theirs.items() if not k.endswith((".attn.bias",
                                                                 ".attn.masked_bias"))}
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    assert hf.model_config(tmp_path) == hf.model_config(FIXTURES / family)
    ids, ref = _io(family)
    assert rel_err(logits_of(hf.load(tmp_path), ids), ref) < TOLERANCE


def _random_params(model, seed=0):
    rng = np.random.default_rng(seed)
    return {k: v + rng.normal(0, 0.1, v.shape).astype(np.float32)
            for k, v in hf.unrolled_params(model).items()}


def test_linear_model_exports_in_our_format_and_reads_back(tmp_path):
    """A hedgehog model (no transformers family; with the new feature_rope and bias
    options) goes out scanned as safetensors + our config and comes back unrolled with
    the same parameters and logits."""
    cfg = ModelConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=2, d_ff=64,
                      mixer="hedgehog", feature_rope=True, qkv_bias=True, scan_layers=True)
    params = _random_params(LanguageModel(cfg, rngs=nnx.Rngs(0)))
    model = hf.build(cfg, params)
    assert model.scan is not None  # stacked layout on the way out
    assert hf.save(model, tmp_path) == hf.OURS
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "linmix" and config["model"]["mixer"] == "hedgehog"
    saved = hf.read_tensors(tmp_path)
    assert sorted(saved) == sorted(params)  # unrolled names, whatever the layout
    for k in params:
        np.testing.assert_array_equal(saved[k], params[k], err_msg=k)
    back = hf.load(tmp_path, scan_layers=False)
    assert back.scan is None
    ids = np.arange(24, dtype=np.int32).reshape(2, 12) % 40
    assert rel_err(logits_of(back, ids), np.asarray(logits_of(model, ids))) < 1e-5


def test_sharded_and_bfloat16_checkpoints_read(tmp_path):
    """A checkpoint split over two files with an index, one of them bfloat16 (which
    numpy's safetensors reader does not take), reads as the one file did."""
    import ml_dtypes
    tensors = hf.read_tensors(FIXTURES / "qwen2")
    names = sorted(tensors)
    half = names[: len(names) // 2]
    hf.write_tensors(tmp_path / "a.safetensors", {k: tensors[k] for k in half})
    # The second shard as bfloat16 bytes, written by hand in the safetensors layout.
    rest = {k: tensors[k].astype(ml_dtypes.bfloat16) for k in names[len(half):]}
    header, offset, blobs = {}, 0, []
    for k, v in rest.items():
        b = v.tobytes()
        header[k] = {"dtype": "BF16", "shape": list(v.shape),
                     "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    head = json.dumps(header).encode()
    (tmp_path / "b.safetensors").write_bytes(len(head).to_bytes(8, "little") + head
                                             + b"".join(blobs))
    weight_map = {**{k: "a.safetensors" for k in half},
                  **{k: "b.safetensors" for k in rest}}
    (tmp_path / hf.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((FIXTURES / "qwen2" / "config.json").read_text())
    read = hf.read_tensors(tmp_path)
    for k in names:
        want = tensors[k] if k in half else rest[k].astype(np.float32)
        np.testing.assert_array_equal(np.asarray(read[k], np.float32), want)
    ids, ref = _io("qwen2")
    # Half the weights rounded to bfloat16.
    assert rel_err(logits_of(hf.load(tmp_path), ids), ref) < 2e-2


def test_unsupported_or_mismatched_checkpoints_are_named(tmp_path):
    hf_cfg = json.loads((FIXTURES / "llama" / "config.json").read_text())
    with pytest.raises(ValueError, match="model_type='t5'"):
        hf_config.from_hf({**hf_cfg, "model_type": "t5"})
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        hf_config.from_hf({**hf_cfg, "rope_parameters": {"rope_type": "yarn",
                                                          "factor": 4.0}})
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        hf_config.from_hf({**hf_cfg, "hidden_act": "gelu"})
    tensors = hf.read_tensors(FIXTURES / "llama")
    cfg = hf.model_config(FIXTURES / "llama")
    broken = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    broken["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)
    with pytest.raises(ValueError, match=r"missing model\.norm\.weight.*not used model"
                                         r"\.layers\.0\.self_attn\.q_norm\.weight"):
        hf.params_from_hf(broken, cfg, "llama")
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load(tmp_path)


def test_export_refuses_what_no_family_has():
    base = dict(vocab_size=40, d_model=32, num_layers=2, num_heads=2)
    with pytest.raises(hf_config.UnsupportedConfig, match="not softmax"):
        hf_config.to_hf(ModelConfig(**base, mixer="hedgehog"))
    with pytest.raises(hf_config.UnsupportedConfig, match="norm='layernorm'"):
        hf_config.to_hf(ModelConfig(**base, norm="layernorm"))
    with pytest.raises(hf_config.UnsupportedConfig, match="o_bias"):
        hf_config.to_hf(ModelConfig(**base, o_bias=True))


def test_default_blocks_keep_their_parameters():
    """The new options default to this repository's blocks: an old config (none of the
    new keys) builds the same parameter names as before they existed, so old
    checkpoints load."""
    old = {"vocab_size": 40, "d_model": 32, "num_layers": 1, "num_heads": 2,
           "mixer": "softmax", "scan_layers": False}
    cfg = ModelConfig.from_dict(old)
    names = sorted(hf.unrolled_params(LanguageModel(cfg, rngs=nnx.Rngs(0))))
    layer = ["mixer/k_proj/kernel", "mixer/o_proj/kernel", "mixer/q_proj/kernel",
             "mixer/v_proj/kernel", "mixer_norm/scale", "mlp/down/kernel",
             "mlp/gate/kernel", "mlp/up/kernel", "mlp_norm/scale"]
    assert names == sorted(["embed/embedding", "final_norm/scale", "head/kernel"]
                           + [f"blocks/0/{n}" for n in layer])
    assert (cfg.norm, cfg.mlp_type, cfg.positions, cfg.rope_scaling) == (
        "rmsnorm", "swiglu", "rope", "none")
