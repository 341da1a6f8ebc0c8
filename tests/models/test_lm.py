"""LanguageModel: the 1-in-8 hybrid decodes exactly like its forward, packed segments,
remat, bf16 compute, dropout, tied embeddings, logical axis names."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import LanguageModel
from tests.models.helpers import Functional, close, tiny_config

B, T, SPLIT = 2, 20, 12
AXES = {"embed", "vocab", "mlp", "heads", "kv", "norm", None}
_CACHE = {}


def hybrid(**overrides):
    """8 tiny layers, softmax at layer 7 (the 1-in-8 hybrid), gated_deltanet elsewhere."""
    key = tuple(sorted(overrides.items()))
    if key not in _CACHE:
        cfg = tiny_config(**{"num_layers": 8, "mixer": "gated_deltanet", "softmax_every": 8,
                             **overrides})
        _CACHE[key] = (cfg, Functional(LanguageModel(cfg, rngs=nnx.Rngs(0))))
    return _CACHE[key]


def tokens(cfg, batch=B, seq=T, seed=1):
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, cfg.vocab_size)


def test_hybrid_layout():
    cfg, f = hybrid()
    assert f.module.layer_mixers() == ["gated_deltanet"] * 7 + ["softmax"]


def test_hybrid_decode_and_prefill_equal_forward():
    cfg, f = hybrid()
    tok = tokens(cfg)
    full = f(tok)
    assert full.shape == (B, T, cfg.vocab_size) and full.dtype == jnp.float32
    cache = f.module.init_cache(B, cfg.max_len)
    dec, end = f.steps("decode_step", cache, tok)
    close(full, dec)
    assert int(end["pos"]) == T
    shapes = lambda c: jax.tree.map(lambda a: (a.shape, a.dtype), c)
    assert shapes(end) == shapes(cache)  # linear layers fixed, the KV cache preallocated
    logits0, cache = f.method("prefill", tok[:, :SPLIT], f.module.init_cache(B, cfg.max_len))
    assert int(cache["pos"]) == SPLIT
    logits1, _ = f.steps("decode_step", cache, tok[:, SPLIT:])
    close(full, jnp.concatenate([logits0, logits1], axis=1))


def test_hybrid_packed_segments_equal_documents_alone():
    cfg, f = hybrid()
    tok = tokens(cfg)
    cuts = [5, 14]
    seg = jnp.array([[3] * c + [4] * (T - c) for c in cuts], jnp.int32)
    packed = f(tok, seg)
    alone_tok = jnp.stack([jnp.concatenate([tok[i, c:], tok[i, :c]]) for i, c in enumerate(cuts)])
    alone, plain = f(alone_tok), f(tok)
    for i, c in enumerate(cuts):
        close(plain[i, :c], packed[i, :c])
        close(alone[i, :T - c], packed[i, c:])


def test_state_size_sums_layers():
    cfg, f = hybrid()
    h, d, c = cfg.num_heads, cfg.resolved_head_dim, cfg.conv_size
    gdn = h * d * d + 3 * (c - 1) * h * d
    per_token = 2 * cfg.resolved_kv_heads * d
    assert f.module.state_size() == 7 * gdn + per_token
    assert f.module.state_size(seq_len=100) == 7 * gdn + 100 * per_token


def test_layer_pattern_overrides():
    cfg = tiny_config(num_layers=3, mixer="linear", layer_pattern="SLS", softmax_every=2)
    m = LanguageModel(cfg, rngs=nnx.Rngs(0))
    assert m.layer_mixers() == ["softmax", "linear", "softmax"]
    assert [type(b.mixer).__name__ for b in m.blocks] == ["SoftmaxAttention", "LinearAttention",
                                                          "SoftmaxAttention"]


def _loss_and_grads(model, tok):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def loss_fn(params, rest):
        logits = nnx.merge(graphdef, params, rest)(tok)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
            logits, tok[..., None], -1)[..., 0])
    return jax.value_and_grad(loss_fn)(params, rest)


def test_remat_same_loss_and_grads():
    kw = dict(num_layers=1, mixer="linear", impl="parallel")  # cheap to compile
    tok = tokens(tiny_config())
    l0, g0 = _loss_and_grads(LanguageModel(tiny_config(**kw), rngs=nnx.Rngs(0)), tok)
    l1, g1 = _loss_and_grads(LanguageModel(tiny_config(remat=True, **kw), rngs=nnx.Rngs(0)), tok)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), g0, g1)


def test_bfloat16_compute_float32_params_and_logits():
    kw = dict(num_layers=2, mixer="gated_deltanet")
    tok = tokens(tiny_config())
    m32 = LanguageModel(tiny_config(**kw), rngs=nnx.Rngs(0))
    m16 = LanguageModel(tiny_config(dtype="bfloat16", **kw), rngs=nnx.Rngs(0))
    dtypes = {p.dtype for p in jax.tree.leaves(nnx.state(m16, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}
    y32, y16 = Functional(m32)(tok), Functional(m16)(tok)
    assert y16.dtype == jnp.float32
    # bf16 keeps ~3 significant digits per rounding; several roundings per layer.
    err = jnp.abs(y32 - y16)
    assert float(err.max()) < 0.15 * float(jnp.abs(y32).max()), float(err.max())
    assert float(err.mean()) < 0.05 * float(jnp.abs(y32).mean()), float(err.mean())
    # decode in bf16 keeps the float32 state of the linear layers
    cache = m16.init_cache(B, 8)
    assert cache["layers"][0]["attn"].dtype == jnp.float32


_apply = nnx.jit(lambda m, tok, det: m(tok, deterministic=det), static_argnums=2)


def test_dropout_only_when_not_deterministic():
    cfg = tiny_config(num_layers=1, mixer="linear", dropout=0.5)
    m = LanguageModel(cfg, rngs=nnx.Rngs(0, dropout=1))
    tok = tokens(cfg)
    a, b = _apply(m, tok, True), _apply(m, tok, True)
    np.testing.assert_array_equal(a, b)
    c, d = _apply(m, tok, False), _apply(m, tok, False)  # the RNG advances between calls
    assert float(jnp.max(jnp.abs(c - a))) > 1e-3 and float(jnp.max(jnp.abs(c - d))) > 1e-3


@pytest.mark.parametrize("mixer", ["softmax", "sliding_window"])
def test_attention_dropout_only_in_training(mixer):
    """attention_dropout leaves parameters and evaluation unchanged; training draws masks."""
    tok = tokens(tiny_config())
    plain = LanguageModel(tiny_config(num_layers=1, mixer=mixer), rngs=nnx.Rngs(0, dropout=1))
    drop = LanguageModel(tiny_config(num_layers=1, mixer=mixer, attention_dropout=0.5),
                         rngs=nnx.Rngs(0, dropout=1))
    for (pa, a), (pb, b) in zip(nnx.to_flat_state(nnx.state(plain, nnx.Param)),
                                nnx.to_flat_state(nnx.state(drop, nnx.Param))):
        assert pa == pb
        np.testing.assert_array_equal(a.value, b.value)
    np.testing.assert_allclose(_apply(drop, tok, True), _apply(plain, tok, True),
                               rtol=1e-6, atol=1e-6)
    c, d = _apply(drop, tok, False), _apply(drop, tok, False)
    assert float(jnp.max(jnp.abs(c - _apply(plain, tok, True)))) > 1e-3
    assert float(jnp.max(jnp.abs(c - d))) > 1e-3  # a fresh mask each call


def test_tied_embeddings_and_no_mlp():
    cfg = tiny_config(num_layers=1, mixer="softmax", tie_embeddings=True, mlp=False)
    m = LanguageModel(cfg, rngs=nnx.Rngs(0))
    assert m.head is None and m.blocks[0].mlp is None
    tok = tokens(cfg)
    x = m.embed(tok)
    blk = m.blocks[0]
    x = x + blk.mixer(blk.mixer_norm(x))
    want = m.final_norm(x) @ m.embed.embedding[...].T
    np.testing.assert_allclose(m(tok), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mixer", ["gated_deltanet", "based", "performer", "hedgehog",
                                   "lightning", "linear"])
def test_every_parameter_has_logical_axes(mixer):
    m = LanguageModel(tiny_config(mixer=mixer, softmax_every=2), rngs=nnx.Rngs(0))
    for path, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
        names = var.get_metadata().get("out_sharding")
        assert names is not None, f"{path} has no logical axis names"
        assert len(names) == var.value.ndim and set(names) <= AXES, (path, names)
        if path[-1] == "scale":
            assert names == ("norm",)
    specs = nnx.get_partition_spec(nnx.state(m, nnx.Param))
    spec = specs["embed"]["embedding"]
    assert getattr(spec, "value", spec) == jax.sharding.PartitionSpec("vocab", "embed")


def test_remat_with_dropout_draws_like_without():
    kw = dict(num_layers=2, mixer="linear", dropout=0.3)
    tok = tokens(tiny_config())
    plain = LanguageModel(tiny_config(**kw), rngs=nnx.Rngs(0, dropout=5))
    remat = LanguageModel(tiny_config(remat=True, **kw), rngs=nnx.Rngs(0, dropout=5))
    first = _apply(remat, tok, False)
    np.testing.assert_allclose(_apply(plain, tok, False), first, rtol=1e-5, atol=1e-6)
    second = _apply(remat, tok, False)  # fresh masks: remat advanced the RNG too
    np.testing.assert_allclose(_apply(plain, tok, False), second, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(first - second))) > 1e-3
