"""The stacked forms (models.layers.stacked_dense / stacked_short_conv, and the delta-rule
mixers' inputs built through them) against the unfused ones they replace: each layer
called on its own, outputs and gradients in float32 on CPU."""
import math

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from models import ModelConfig
from models.layers import ShortConv, dense, l2_normalize, stacked_dense, stacked_short_conv
from models.mixers import get_mixer

B, T, D, C = 2, 19, 12, 8


def cfg(**kw):
    return ModelConfig(d_model=D, num_heads=2, max_len=T, dtype="float32", **kw)


def segments():
    """Two rows: one with a document starting mid-row, one with three documents."""
    ids = np.zeros((B, T), np.int32)
    ids[0, 7:] = 1
    ids[1, 3:11], ids[1, 11:] = 1, 2
    return jnp.asarray(ids)


def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("use_bias", [False, True, "mixed"])
def test_stacked_dense_is_each_layer(use_bias):
    # "mixed": q, k, v with biases (an imported teacher's) beside a gate without one
    biased = [use_bias is True or (use_bias == "mixed" and i < 3) for i in range(4)]
    layers = [dense(cfg(), D, C, ("embed", "heads"), rngs=nnx.Rngs(i), use_bias=b)
              for i, b in enumerate(biased)]
    for i, layer in enumerate(layers):  # nonzero biases, so a mixed-up bias would show
        if layer.bias is not None:
            layer.bias[...] = jax.random.normal(jax.random.key(10 + i), (C,))
    graph, params = nnx.split(nnx.List(layers))
    x = jax.random.normal(jax.random.key(0), (B, T, D))

    def stacked(params, x):
        return stacked_dense(list(nnx.merge(graph, params)), x)

    def separate(params, x):
        return jnp.stack([layer(x) for layer in nnx.merge(graph, params)], axis=-2)

    assert stacked(params, x).shape == (B, T, 4, C)
    assert max_diff(stacked(params, x), separate(params, x)) < 1e-6
    ct = jax.random.normal(jax.random.key(1), (B, T, 4, C))
    grads = [jax.grad(lambda p, x: jnp.sum(f(p, x) * ct), argnums=(0, 1))(params, x)
             for f in (stacked, separate)]
    assert max_diff(*grads) < 1e-5


@pytest.mark.parametrize("bias,activation", [(False, True), (True, False)])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("size", [4, 2])
def test_stacked_short_conv_is_each_conv(bias, activation, with_state, size):
    convs = [ShortConv(cfg(conv_size=size), C, rngs=nnx.Rngs(i), bias=bias,
                       activation=activation) for i in range(3)]
    graph, params = nnx.split(nnx.List(convs))
    x = jax.random.normal(jax.random.key(0), (B, T, 3, C))
    state = (jax.random.normal(jax.random.key(2), (B, size - 1, 3, C)) if with_state
             else None)
    seg = segments()

    def stacked(params, x, state):
        return stacked_short_conv(list(nnx.merge(graph, params)), x, segment_ids=seg,
                                  state=state)

    def separate(params, x, state):
        outs = [conv(x[:, :, i], segment_ids=seg,
                     state=None if state is None else state[:, :, i])
                for i, conv in enumerate(nnx.merge(graph, params))]
        return (jnp.stack([y for y, _ in outs], 2), jnp.stack([s for _, s in outs], 2))

    got, want = stacked(params, x, state), separate(params, x, state)
    assert got[0].shape == (B, T, 3, C) and got[1].shape == (B, size - 1, 3, C)
    assert max_diff(got, want) < 1e-6
    ct = jax.random.normal(jax.random.key(1), (B, T, 3, C))

    def grad(f):
        return jax.grad(lambda p, x: jnp.sum(f(p, x, state)[0] * ct), argnums=(0, 1))(
            params, x)
    assert max_diff(grad(stacked), grad(separate)) < 1e-5


def unfused_inputs(m, x, seg):
    """The delta-rule mixers' op inputs written layer by layer (as before stacking)."""
    b, t, _ = x.shape
    h, d = m.num_heads, m.head_dim
    q, _ = m.q_conv(m.q_proj(x), segment_ids=seg)
    k, _ = m.k_conv(m.k_proj(x), segment_ids=seg)
    v, _ = m.v_conv(m.v_proj(x), segment_ids=seg)
    out = {"q": l2_normalize(q.reshape(b, t, h, d)) * (1.0 / math.sqrt(d)),
           "k": l2_normalize(k.reshape(b, t, h, d)), "v": v.reshape(b, t, h, d),
           "beta": jax.nn.sigmoid(m.b_proj(x))}
    if hasattr(m, "a_proj"):
        a = m.a_proj(x) + m.dt_bias[...]
        out["log_alpha"] = -jnp.exp(m.A_log[...]) * jax.nn.softplus(a)
    else:
        out["log_alpha"] = jnp.zeros_like(out["beta"])
    # the output gate's projection (gated_deltanet), made in q, k, v's matmul
    out["gate"] = m.g_proj(x) if hasattr(m, "g_proj") else None
    return out


@pytest.mark.parametrize("mixer", ["gated_deltanet", "deltanet"])
def test_delta_rule_inputs_are_the_unfused_ones(mixer):
    m = get_mixer(mixer)(cfg(mixer=mixer, qkv_bias=True), rngs=nnx.Rngs(0))
    graph, params = nnx.split(m)
    x = jax.random.normal(jax.random.key(0), (B, T, D))
    seg = segments()

    def fused(params, x):
        return nnx.merge(graph, params)._inputs(x, segment_ids=seg, conv_state=None)[0]

    def unfused(params, x):
        return unfused_inputs(nnx.merge(graph, params), x, seg)

    assert max_diff(fused(params, x), unfused(params, x)) < 1e-6
    cts = jax.tree.map(lambda a: jax.random.normal(jax.random.key(a.size), a.shape),
                       unfused(params, x))

    def grad(f):
        return jax.grad(lambda p, x: sum(jnp.sum(f(p, x)[n] * cts[n]) for n in cts
                                         if cts[n] is not None),
                        argnums=(0, 1))(params, x)
    assert max_diff(grad(fused), grad(unfused)) < 1e-5


def test_delta_rule_decode_state_keeps_one_entry_per_conv():
    """The conv state a decode step carries stays {"q", "k", "v"} of (B, c-1, H*d) each,
    and a prefill split in two pieces equals it in one."""
    c = cfg(mixer="gated_deltanet")
    m = get_mixer("gated_deltanet")(c, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (B, T, D))
    y, state = m.prefill(x, m.init_state(B))
    assert set(state["conv"]) == {"q", "k", "v"}
    assert all(s.shape == (B, c.conv_size - 1, D) for s in state["conv"].values())
    y1, mid = m.prefill(x[:, :8], m.init_state(B))
    y2, end = m.prefill(x[:, 8:], mid)
    assert max_diff(jnp.concatenate([y1, y2], 1), y) < 1e-5
    assert max_diff(end, state) < 1e-5
