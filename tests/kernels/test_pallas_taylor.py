"""kernels.pallas.linear_attention with taylor_qk (Based's path: the in-chunk scores from
the d-wide inputs, 1 + s + s^2 / 2, the normaliser from the features' time layout)
against a float64 lax.scan over the Taylor features themselves: outputs, final states
and the gradients of the raw q, k (through the features and taylor_qk together), v and
the initial state; with and without packed documents, both programs in interpret mode
on CPU. At d = 4 the 15 Taylor features come padded to 16 with zeros; at d = 10 the 66
come as they are and the kernel splits them into two tiles (64 + 16 columns,
kernels.pallas.linear.feature_groups)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from kernels import ops
from kernels.pallas.linear import feature_groups
from models import feature_maps as fm
from tests.kernels import test_pallas, test_pallas_segments

D, F, V, EPS = 4, 16, 32, 1e-6


def features(x, f=F):
    """Taylor features of x, zero-padded to f columns."""
    phi = fm.taylor_symmetric(x)
    return jnp.pad(phi, [(0, 0)] * (phi.ndim - 1) + [(0, f - phi.shape[-1])])


def inputs(seed, b, t, h, d=D, f=F):
    rng = np.random.default_rng(seed)
    xq, xk = ((0.7 / (d / D) ** 0.25) * rng.standard_normal((b, t, h, d)).astype(np.float32)
              for _ in "qk")
    v = rng.standard_normal((b, t, h, V)).astype(np.float32)
    s0 = (0.3 * rng.standard_normal((b, h, f, V))).astype(np.float32)
    z0 = rng.uniform(0.5, 1.5, (b, h, f)).astype(np.float32)
    z0[..., fm.taylor_symmetric_dim(d):] = 0.0  # a state the features could have made
    s0[..., fm.taylor_symmetric_dim(d):, :] = 0.0
    return xq, xk, v, s0, z0


def test_feature_groups_tile_the_features_in_fewer_columns():
    """Two tiles where they cover F in fewer columns than one (Based's 153: 128 + 32),
    else one; every group a power of two >= 16 and the groups cover [0, F) in order."""
    assert feature_groups(153) == ((0, 128, 128), (128, 153, 32))
    assert feature_groups(66) == ((0, 64, 64), (64, 66, 16))
    assert feature_groups(273) == ((0, 256, 256), (256, 273, 32))
    for f, tile in ((256, 256), (200, 256), (15, 16), (20, 32), (16, 16), (1, 16)):
        assert feature_groups(f) == ((0, f, tile),)
    assert feature_groups(153, max_tiles=1) == ((0, 153, 256),)
    for f in range(1, 600):
        groups = feature_groups(f)
        assert [g[0] for g in groups] == [0] + [g[1] for g in groups[:-1]]
        assert groups[-1][1] == f
        for lo, hi, width in groups:
            assert width >= max(16, hi - lo) and width & (width - 1) == 0
        assert sum(w for *_, w in groups) <= max(16, 1 << (f - 1).bit_length())


@pytest.mark.parametrize("variant", ["tpu", "gpu"] if jax.default_backend() == "cpu"
                         else ["tpu" if jax.default_backend() == "tpu" else "gpu"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("d,f", [(D, F), (10, fm.taylor_symmetric_dim(10))])
def test_taylor_scores_match_float64_features(variant, packed, d, f):
    if packed:
        seg = test_pallas_segments.segment_ids()
        b, t, chunk = seg.shape[0], seg.shape[1], 32
        starts = test_pallas_segments.starts_of(seg)
    else:
        seg, b, t, chunk, starts = None, 2, 37, 16, None
    h = 2
    xq, xk, v, s0, z0 = inputs(7, b, t, h, d, f)
    rng = np.random.default_rng(1)
    co = rng.standard_normal((b, t, h, V))
    cs, cz = rng.standard_normal(s0.shape), rng.standard_normal(z0.shape)

    def loss_of(out, s, z, dtype):
        return (jnp.sum(out * co.astype(dtype)) + jnp.sum(s * cs.astype(dtype))
                + jnp.sum(z * cz.astype(dtype)))

    def mine(xq, xk, v, s0, z0):
        out, (s, z) = kp.linear_attention(
            features(xq, f), features(xk, f), v, normalize=True, eps=EPS, initial_state=(s0, z0),
            return_state=True, chunk_size=chunk, segment_ids=seg, variant=variant,
            taylor_qk=(xq, xk))
        return loss_of(out, s, z, np.float32), (out, s, z)

    def reference(xq, xk, v, s0, z0):
        g = jnp.zeros(xq.shape[:3], xq.dtype)
        out, s, z = test_pallas.jax_linear64(features(xq, f), features(xk, f), v, g, s0, z0,
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
    trains (d = 16: 153 features in two tiles), lowers for CUDA through the Triton
    programs (checked on CPU)."""
    from kernels.pallas import common
    monkeypatch.setattr(common, "interpret", lambda: False)
    seg = jnp.asarray(test_pallas_segments.segment_ids())
    b, t = seg.shape
    d, f = 16, fm.taylor_symmetric_dim(16)
    xq, xk, v, _, _ = (jnp.asarray(x, jnp.bfloat16) for x in inputs(5, b, t, 2, d, f))

    def loss(xq, xk, v):
        o = kp.linear_attention(features(xq, f), features(xk, f), v, chunk_size=32,
                                segment_ids=seg, variant="gpu", taylor_qk=(xq, xk))
        return jnp.sum(o.astype(jnp.float32))
    text = jax.jit(jax.grad(loss, (0, 1, 2))).trace(xq, xk, v).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    for width in (128, 32):   # each group's final state (B * H, width, V)
        assert f"tensor<{b * 2}x{width}x{V}xf32>" in text, width
