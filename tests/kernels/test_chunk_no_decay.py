"""kernels.chunk linear attention with no decay (g=None): the decay terms become plain
masks, statically. Against a float64 NumPy loop (with segments and an initial state),
against the g = 0 path, and structurally: no cumsum/exp of zeros in the traced program.
"""
import numpy as np

import jax
import jax.numpy as jnp

from kernels import chunk
from kernels.common import run_ids
from tests.kernels.jaxprs import equations

B, H, T, F, DV, C = 2, 2, 37, 8, 4, 16


def np_linear_segments(q, k, v, segment_ids, s0):
    """S_t = S_{t-1} (reset to 0 where the segment changes) + k_t v_t^T; o_t = S_t^T q_t.
    Head-major float64; the initial state belongs to the first segment."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.array(s0, np.float64)
    o = np.zeros(q.shape[:3] + (v.shape[-1],))
    for t in range(q.shape[2]):
        if t > 0:
            keep = (segment_ids[:, t] == segment_ids[:, t - 1]).astype(np.float64)
            s = s * keep[:, None, None, None]
        s = s + k[:, :, t, :, None] * v[:, :, t, None, :]
        o[:, :, t] = np.einsum("bhf,bhfd->bhd", q[:, :, t], s)
    return o, s


def inputs(seed):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, H, T, F)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, H, T, DV)).astype(np.float32)
    s0 = rng.standard_normal((B, H, F, DV)).astype(np.float32)
    seg = np.zeros((B, T), np.int32)
    seg[0, 10:] = 1            # a boundary inside the first chunk
    seg[0, 30:] = 2            # and one inside the last
    seg[1, 16:] = 5            # exactly on a chunk boundary
    return q, k, v, s0, seg


def test_no_decay_matches_float64_loop_with_segments():
    q, k, v, s0, seg = inputs(0)
    run = run_ids(jnp.asarray(seg), B, T)
    o, s = chunk.linear_attention_chunk(q, k, v, None, run, s0, C)
    ro, rs = np_linear_segments(q, k, v, seg, s0)
    np.testing.assert_allclose(o, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-5)


def test_no_decay_gradients_match_zero_decay_path():
    q, k, v, s0, seg = inputs(1)
    run = run_ids(jnp.asarray(seg), B, T)
    rng = np.random.default_rng(2)
    co = rng.standard_normal((B, H, T, DV))
    cs = rng.standard_normal((B, H, F, DV))

    def loss(g):
        def f(q, k, v, s0):
            o, s = chunk.linear_attention_chunk(q, k, v, g, run, s0, C)
            return jnp.sum(o * co) + jnp.sum(s * cs)
        return jax.grad(f, argnums=(0, 1, 2, 3))

    got = loss(None)(q, k, v, s0)
    ref = loss(jnp.zeros((B, H, T), jnp.float32))(q, k, v, s0)
    for a, r in zip(got, ref):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


def test_no_decay_traces_no_cumsum_or_exp():
    q, k, v, s0, _ = inputs(3)
    run = jnp.zeros((B, T), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda *a: chunk.linear_attention_chunk(*a, None, run, s0, C))(
        q, k, v).jaxpr
    prims = {eqn.primitive.name for eqn in equations(jaxpr)}
    assert "dot_general" in prims             # the walk did reach the chunk math
    assert not prims & {"cumsum", "exp", "reduce_window_sum"}, prims
