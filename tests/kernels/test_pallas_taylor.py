"""kernels.pallas.linear_attention with taylor_qk (Based's path: the in-chunk scores from
the d-wide inputs, 1 + s + s^2 / 2, the normaliser from the features' time layout)
against a float64 lax.scan over the Taylor features themselves: outputs, final states
and the gradients of the raw q, k (through the features and taylor_qk together), v and
the initial state; with and without packed documents, both programs in interpret mode
on CPU. The padded feature columns (15 Taylor features at d = 4, run as 16) are zero,
as kernels.ops pads them."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from kernels import ops
from models import feature_maps as fm
from tests.kernels import test_pallas, test_pallas_segments

D, F, V, EPS = 4, 16, 32, 1e-6


def features(x):
    """Taylor features of x, zero-padded to F columns."""
    phi = fm.taylor_symmetric(x)
    return jnp.pad(phi, [(0, 0)] * (phi.ndim - 1) + [(0, F - phi.shape[-1])])


def inputs(seed, b, t, h):
    rng = np.random.default_rng(seed)
    xq, xk = (0.7 * rng.standard_normal((b, t, h, D)).astype(np.float32) for _ in "qk")
    v = rng.standard_normal((b, t, h, V)).astype(np.float32)
    s0 = (0.3 * rng.standard_normal((b, h, F, V))).astype(np.float32)
    z0 = rng.uniform(0.5, 1.5, (b, h, F)).astype(np.float32)
    z0[..., fm.taylor_symmetric_dim(D):] = 0.0  # a state the features could have made
    s0[..., fm.taylor_symmetric_dim(D):, :] = 0.0
    return xq, xk, v, s0, z0


@pytest.mark.parametrize("variant", ["tpu", "gpu"] if jax.default_backend() == "cpu"
                         else ["tpu" if jax.default_backend() == "tpu" else "gpu"])
@pytest.mark.parametrize("packed", [False, True])
def test_taylor_scores_match_float64_features(variant, packed):
    if packed:
        seg = test_pallas_segments.segment_ids()
        b, t, chunk = seg.shape[0], seg.shape[1], 32
        starts = test_pallas_segments.starts_of(seg)
    else:
        seg, b, t, chunk, starts = None, 2, 37, 16, None
    h = 2
    xq, xk, v, s0, z0 = inputs(7, b, t, h)
    rng = np.random.default_rng(1)
    co = rng.standard_normal((b, t, h, V))
    cs, cz = rng.standard_normal(s0.shape), rng.standard_normal(z0.shape)

    def loss_of(out, s, z, dtype):
        return (jnp.sum(out * co.astype(dtype)) + jnp.sum(s * cs.astype(dtype))
                + jnp.sum(z * cz.astype(dtype)))

    def mine(xq, xk, v, s0, z0):
        out, (s, z) = kp.linear_attention(
            features(xq), features(xk), v, normalize=True, eps=EPS, initial_state=(s0, z0),
            return_state=True, chunk_size=chunk, segment_ids=seg, variant=variant,
            taylor_qk=(xq, xk))
        return loss_of(out, s, z, np.float32), (out, s, z)

    def reference(xq, xk, v, s0, z0):
        g = jnp.zeros(xq.shape[:3], xq.dtype)
        out, s, z = test_pallas.jax_linear64(features(xq), features(xk), v, g, s0, z0,
                                              True, EPS, starts)
        return loss_of(out, s, z, np.float64), (out, s, z)

    args = (xq, xk, v, s0, z0)
    got, (o, s, z) = jax.grad(mine, argnums=tuple(range(5)), has_aux=True)(*args)
    with jax.enable_x64():
        ref, (ro, rs, rz) = jax.grad(reference, argnums=tuple(range(5)), has_aux=True)(
            *(jnp.asarray(x, jnp.float64) for x in args))
    for name, a, r in [("o", o, ro), ("s", s, rs), ("z", z, rz)] + list(
            zip(("dxq", "dxk", "dv", "ds0", "dz0"), got, ref)):
        assert test_pallas.rel(a, r) <= 2e-5, (name, test_pallas.rel(a, r))


def test_ops_passes_taylor_qk_and_checks_it():
    """kernels.ops.linear_attention: the chunk form ignores the hint and gives the same
    outputs as the Pallas path that reads it; bad shapes and a decay are refused."""
    xq, xk, v, _, _ = inputs(3, 2, 37, 2)
    q, k = features(xq), features(xk)
    want = ops.linear_attention(q, k, v, impl="chunk", chunk_size=16)
    got = ops.linear_attention(q, k, v, impl="pallas", chunk_size=16, taylor_qk=(xq, xk))
    assert test_pallas.rel(got, want) <= 1e-5
    with pytest.raises(ValueError, match="taylor_qk's x_k"):
        ops.linear_attention(q, k, v, impl="chunk", taylor_qk=(xq, xk[:, :5]))
    with pytest.raises(ValueError, match="undecayed"):
        ops.linear_attention(q, k, v, impl="chunk", taylor_qk=(xq, xk),
                             log_decay=jnp.zeros((2,)))


def test_taylor_path_lowers_for_the_gpu(monkeypatch):
    """The gradient program of the Taylor path, packed documents and bf16 as Based
    trains, lowers for CUDA through the Triton programs (checked on CPU)."""
    from kernels.pallas import common
    monkeypatch.setattr(common, "interpret", lambda: False)
    seg = jnp.asarray(test_pallas_segments.segment_ids())
    b, t = seg.shape
    xq, xk, v, _, _ = (jnp.asarray(x, jnp.bfloat16) for x in inputs(5, b, t, 2))

    def loss(xq, xk, v):
        o = kp.linear_attention(features(xq), features(xk), v, chunk_size=32,
                                segment_ids=seg, variant="gpu", taylor_qk=(xq, xk))
        return jnp.sum(o.astype(jnp.float32))
    text = jax.jit(jax.grad(loss, (0, 1, 2))).trace(xq, xk, v).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text
