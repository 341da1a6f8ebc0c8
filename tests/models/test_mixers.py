"""Every registered mixer: decode == forward, prefill + decode == forward, packed
segments == documents alone, causality, fixed-size state, hand-counted state_size."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import MIXERS, get_mixer
from models.mixers import FIXED_STATE
from models.mixers.recurrent import RecurrentMixer
from tests.models import reference
from tests.models.helpers import Functional, close, tiny_config

B, T, SPLIT = 2, 20, 12
ALL = sorted(MIXERS)
LINEAR = sorted(FIXED_STATE)
_CACHE = {}


def build(name, **overrides):
    key = (name, tuple(sorted(overrides.items())))
    if key not in _CACHE:
        cfg = tiny_config(**overrides)
        _CACHE[key] = (cfg, Functional(get_mixer(name)(cfg, rngs=nnx.Rngs(0))))
    return _CACHE[key]


def inputs(cfg, batch=B, seq=T, seed=1):
    return jax.random.normal(jax.random.key(seed), (batch, seq, cfg.d_model))


def test_registry_has_every_mixer():
    assert set(MIXERS) == {"softmax", "sliding_window", "linear", "performer", "hedgehog",
                           "taylor", "based", "gated_deltanet", "deltanet", "lightning",
                           "base_conv", "gated_conv", "hedgehog_window"}


@pytest.mark.parametrize("name", ALL)
def test_decode_equals_forward(name):
    cfg, f = build(name)
    x = inputs(cfg)
    full = f(x)
    state = f.module.init_state(B, cfg.max_len)
    dec, _ = f.steps("step", state, x)
    close(full, dec)


@pytest.mark.parametrize("name", ALL)
def test_prefill_then_decode_equals_forward(name):
    cfg, f = build(name)
    x = inputs(cfg)
    full = f(x)
    state = f.module.init_state(B, cfg.max_len)
    y0, state = f.method("prefill", x[:, :SPLIT], state)
    y1, _ = f.steps("step", state, x[:, SPLIT:])
    close(full, jnp.concatenate([y0, y1], axis=1))


@pytest.mark.parametrize("name", sorted(m for m in ALL if m == "based"
                                         or issubclass(MIXERS[m], RecurrentMixer)))
def test_prefill_in_pieces_equals_one_prefill(name, monkeypatch):
    """A prefill longer than recurrent.PREFILL_SEGMENT runs piece by piece (7 tokens here,
    T = 18: pieces of 7, 7, 4; Based's through its Taylor part), carrying the op's state and the short conv's: the same
    outputs and state as the whole prompt at once, and decoding from it equals the full
    forward."""
    from models.mixers import recurrent
    cfg, f = build(name)
    x = inputs(cfg)
    state0 = f.module.init_state(B, cfg.max_len)
    y_one, s_one = f.method("prefill", x[:, :T - 2], state0)
    monkeypatch.setattr(recurrent, "PREFILL_SEGMENT", 7)
    y_pieces, s_pieces = f.method("prefill", x[:, :T - 2], state0)
    close(y_one, y_pieces)
    jax.tree.map(close, s_one, s_pieces)
    y_last, _ = f.steps("step", s_pieces, x[:, T - 2:])
    close(f(x), jnp.concatenate([y_pieces, y_last], axis=1))


@pytest.mark.parametrize("length", [1, 5, 6, 7, 15])
def test_hedgehog_window_prefill_equals_its_decode(length):
    """LoLCATs' layer prefills a fresh state in the blocked form and builds the state in
    one go (window_linear.state_after): the same outputs and state as the prompt token by
    token, prompts shorter than, equal to and past the window (6, so the ring buffer
    wraps); a second prefill (a non-fresh state) goes token by token, and decoding after
    both equals the forward pass."""
    cfg, f = build("hedgehog_window")
    x = inputs(cfg)
    state0 = f.module.init_state(B, cfg.max_len)
    y_fast, s_fast = f.method("prefill", x[:, :length], state0)
    y_slow, s_slow = f.steps("step", state0, x[:, :length])
    close(y_slow, y_fast)
    jax.tree.map(close, s_slow, s_fast)
    assert int(s_fast["pos"]) == length
    y_more, s_more = f.method("prefill", x[:, length:length + 4], s_fast)
    y_last, _ = f.steps("step", s_more, x[:, length + 4:])
    close(f(x), jnp.concatenate([y_fast, y_more, y_last], axis=1))


@pytest.mark.parametrize("name", ALL)
def test_packed_segments_equal_documents_alone(name):
    cfg, f = build(name)
    x = inputs(cfg)
    # Row 0 packs documents of 7 and 13 tokens, row 1 of 12 and 8.
    cuts = [7, 12]
    seg = jnp.array([[1] * c + [2] * (T - c) for c in cuts], jnp.int32)
    packed = f(x, seg)
    # The second documents alone, moved to position 0 (zero padding after them is causal-safe).
    alone_x = jnp.stack([jnp.concatenate([x[i, c:], jnp.zeros_like(x[i, :c])])
                         for i, c in enumerate(cuts)])
    alone = f(alone_x)
    plain = f(x)
    for i, c in enumerate(cuts):
        close(plain[i, :c], packed[i, :c])
        close(alone[i, :T - c], packed[i, c:])


@pytest.mark.parametrize("name", ALL)
def test_causal(name):
    cfg, f = build(name)
    x = inputs(cfg)
    y = f(x)
    y2 = f(x.at[:, 15:].set(jax.random.normal(jax.random.key(9), x[:, 15:].shape)))
    close(y[:, :15], y2[:, :15], tol=1e-6)
    assert float(jnp.max(jnp.abs(y[:, 15:] - y2[:, 15:]))) > 1e-3


@pytest.mark.parametrize("name", LINEAR)
def test_state_does_not_grow(name):
    cfg, f = build(name)
    x = inputs(cfg)
    state = f.module.init_state(B, cfg.max_len)
    _, s1 = f.steps("step", state, x[:, :1])
    _, s_many = f.steps("step", state, x)
    shapes = lambda s: jax.tree.map(lambda a: (a.shape, a.dtype), s)
    assert shapes(s1) == shapes(s_many) == shapes(state)
    # ... and does not depend on the max_len asked for.
    assert shapes(f.module.init_state(B, 10)) == shapes(f.module.init_state(B, 1000))


def test_softmax_cache_grows_with_max_len():
    cfg, f = build("softmax")
    s = f.module.init_state(B, 40)
    assert s["k"].shape == (B, 40, cfg.resolved_kv_heads, cfg.resolved_head_dim)


def _hand_state_size(name, cfg):
    h, d, w = cfg.num_heads, cfg.resolved_head_dim, cfg.window
    kv = cfg.resolved_kv_heads
    conv = 3 * (cfg.conv_size - 1) * h * d  # q, k, v convs keep conv_size - 1 inputs
    f = cfg.based_feature_dim
    taylor_f = 1 + f + f * (f + 1) // 2  # symmetric pairs of the outer product once
    m = cfg.num_random_features
    return {
        "softmax": 2 * kv * d,                      # per token of cache
        "sliding_window": w * 2 * kv * d,
        "linear": h * (d * d + d),                  # S (F x Dv) and z (F), F = d
        "performer": h * (m * d + m + 1),           # + the keys' running max c
        "hedgehog": h * (2 * d * d + 2 * d),
        # the window's keys and values (every query head's), then hedgehog's S and z
        "hedgehog_window": w * 2 * h * d + h * (2 * d * d + 2 * d),
        "taylor": h * (taylor_f * d + taylor_f),
        "based": h * (taylor_f * d + taylor_f) + w * 2 * kv * d,
        "base_conv": (cfg.base_conv_size - 1) * cfg.d_model,  # the conv's last inputs
        "gated_conv": (cfg.base_conv_size - 1) * cfg.gated_conv_expand * cfg.d_model // 2,
        "gated_deltanet": h * d * d + conv,
        "deltanet": h * d * d + conv,
        "lightning": h * d * d,
    }[name]


@pytest.mark.parametrize("name", ALL)
def test_state_size_hand_count(name):
    cfg, f = build(name)
    assert f.module.state_size() == _hand_state_size(name, cfg)


def test_state_size_gqa_and_identity_map():
    cfg = tiny_config(num_heads=4, num_kv_heads=1, head_dim=8)
    assert get_mixer("softmax")(cfg, rngs=nnx.Rngs(0)).state_size() == 2 * 1 * 8
    cfg = tiny_config(feature_map="identity")
    # No denominator with the identity map: S only.
    assert get_mixer("linear")(cfg, rngs=nnx.Rngs(0)).state_size() == 2 * 16 * 16
    cfg = tiny_config(feature_map="dpfp")  # F = 2 d
    assert get_mixer("linear")(cfg, rngs=nnx.Rngs(0)).state_size() == 2 * (32 * 16 + 32)


@pytest.mark.parametrize("feature_map", ["relu", "identity", "dpfp"])
def test_linear_feature_maps_decode(feature_map):
    cfg, f = build("linear", feature_map=feature_map)
    x = inputs(cfg)
    dec, _ = f.steps("step", f.module.init_state(B, cfg.max_len), x)
    close(f(x), dec)


def test_grouped_query_softmax_decode():
    cfg, f = build("softmax", num_kv_heads=1)
    x = inputs(cfg)
    dec, _ = f.steps("step", f.module.init_state(B, cfg.max_len), x)
    close(f(x), dec)


def test_parameter_names_for_optimizer_masks():
    cfg = tiny_config()
    gdn = get_mixer("gated_deltanet")(cfg, rngs=nnx.Rngs(0))
    names = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(gdn, nnx.Param))}
    assert {"A_log", "dt_bias", "o_norm/scale"} <= names
    # Decay init as in Mamba-2 / fla: A in [1, 16], softplus(dt_bias) in [1e-3, 1e-1].
    a = jnp.exp(gdn.A_log[...])
    dt = jax.nn.softplus(gdn.dt_bias[...])
    assert bool(jnp.all((a >= 1) & (a <= 16))) and bool(jnp.all((dt > 9e-4) & (dt < 0.11)))
    perf = get_mixer("performer")(cfg, rngs=nnx.Rngs(0))
    # omega is not a Param: optimizers never touch it, decode sees the same draw.
    assert "omega" not in {p[0] for p, _ in nnx.to_flat_state(nnx.state(perf, nnx.Param))}
    assert perf.omega[...].shape == (cfg.num_random_features, cfg.resolved_head_dim)


@pytest.mark.parametrize("name, ref", [
    ("linear", reference.linear_elu),
    ("gated_deltanet", reference.gated_deltanet),
    ("based", reference.based),
    ("sliding_window", reference.window_softmax),
    ("lightning", reference.lightning),
    ("hedgehog", reference.hedgehog),
    ("hedgehog_window", reference.hedgehog_window),
    ("performer", reference.performer),
    ("deltanet", reference.deltanet),
    ("softmax", reference.window_softmax),
])
def test_layer_matches_float64_reference(name, ref):
    """The whole layer (projections, conv, gates, norms, op) against NumPy loops."""
    cfg, f = build(name)
    x = inputs(cfg, seed=4)
    if name in ("hedgehog", "hedgehog_window"):  # move W, b (and the window factors)
        f = Functional(get_mixer(name)(cfg, rngs=nnx.Rngs(0)))  # off their init
        moved = [f.module.feature_map_q.kernel, f.module.feature_map_k.kernel,
                 f.module.feature_map_q.bias, f.module.feature_map_k.bias]
        if name == "hedgehog_window":
            moved.append(f.module.window_factors)
        for i, w in enumerate(moved):
            w[...] = w[...] + 0.3 * jax.random.normal(jax.random.key(5 + i), w[...].shape)
        f = Functional(f.module)
    np.testing.assert_allclose(f(x), ref(f.module, x), rtol=2e-4, atol=2e-5)


def test_full_kv_cache_raises_eagerly():
    cfg, f = build("softmax")
    m = f.module
    state = m.init_state(1, 2)
    x = inputs(cfg, batch=1, seq=3)
    _, state = m.step(x[:, 0], state)
    _, state = m.step(x[:, 1], state)
    with pytest.raises(ValueError, match="KV cache full.*max_len"):
        m.step(x[:, 2], state)
