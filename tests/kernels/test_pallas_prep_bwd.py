"""The GDN preparation's Pallas backward (kernels.pallas.gdn_prep_bwd, from the forward's
saved inverse X) against autodiff of the XLA preparation gdn.prep_xla (triangular solve,
no saved inverse) in float32 and float64, and the one custom VJP over preparation and
recurrence (gdn's GPU path) against float64. Interpret mode on CPU; tiny shapes, chunk 16.
End-to-end gradients: tests/kernels/test_pallas.py.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels.pallas import DEFAULT_TUNING, gdn, prep
from kernels.pallas.gdn_prep import gdn_prep
from kernels.pallas.gdn_prep_bwd import gdn_prep_bwd

C = 16
NAMES = ("dq", "dk", "dv", "dlog_alpha", "dbeta")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def prep_inputs(seed, b, t, h, kd, vd, mode="random"):
    """Inputs as the preparation sees them (T a multiple of the chunk). "edges": log_alpha
    and beta exactly 0 / 1 in places, and the last 5 steps padding (k = v = 0, beta = 0,
    log_alpha = 0) as gated_delta_rule pads a T that is not a multiple of the chunk."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, h, kd)).astype(np.float32)
    k = rng.standard_normal((b, t, h, kd)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((b, t, h, vd)).astype(np.float32)
    g = np.log(rng.uniform(0.7, 1.0, (b, t, h))).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (b, t, h)).astype(np.float32)
    if mode == "edges":
        g[:, ::3] = 0.0
        beta[:, ::2] = 1.0
        beta[:, 1::4] = 0.0
        for x in (q, k, v, g, beta):
            x[:, -5:] = 0.0
    return q, k, v, g, beta


def cotangents(seed, outs):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(o.shape).astype(np.float32) for o in outs)


def prep_vjp(args, cts, dtype=jnp.float32):
    """Gradients of <prep(q, k, v, g, beta), cts> by the Pallas kernels: the forward
    (gdn_prep, writing X) and gdn_prep_bwd from its X; dG w.r.t. the in-chunk cumsum G
    becomes d log_alpha by a reverse in-chunk cumsum."""
    q, k, v, g, beta = args
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    g, beta = jnp.asarray(g), jnp.asarray(beta)
    big_g = prep.in_chunk_cumsum(g, C)
    inverse = gdn_prep(q, k, v, big_g, beta, chunk=C, tuning=DEFAULT_TUNING)[-1]
    dtypes = (dtype, dtype, dtype, jnp.float32)
    dw, dut, dp, dgcl = (jnp.asarray(c, d) for c, d in zip(cts, dtypes))
    dq, dk, dv, dbig_g, dbeta = gdn_prep_bwd(q, k, v, big_g, beta, inverse, dw, dut, dp,
                                             dgcl, chunk=C, tuning=DEFAULT_TUNING)
    return dq, dk, dv, prep.in_chunk_cumsum(dbig_g, C, reverse=True), dbeta


def xla_vjp(args, cts):
    """The same gradients from float32 autodiff of prep_xla (triangular solve)."""
    xs = [jnp.asarray(x, jnp.float32) for x in args]
    _, pull = jax.vjp(lambda *a: gdn.prep_xla(*a, C), *xs)
    return pull(tuple(jnp.asarray(c, jnp.float32) for c in cts))


def float64_vjp(args, cts):
    """The same gradients from float64 autodiff of prep_xla (triangular solve)."""
    with jax.enable_x64():
        xs = [jnp.asarray(x, jnp.float64) for x in args]
        _, pull = jax.vjp(lambda *a: gdn.prep_xla(*a, C), *xs)
        return [np.asarray(r) for r in pull(tuple(jnp.asarray(c, jnp.float64) for c in cts))]


def out_shapes(b, t, h, kd, vd):
    return [np.zeros((b * h, t, kd)), np.zeros((b * h, t, vd)), np.zeros((b * h, t, C)),
            np.zeros((b * h, t // C, 1, 1))]


@pytest.mark.parametrize("kd,vd,mode", [(16, 32, "random"), (32, 16, "edges"),
                                        pytest.param(32, 32, "random", marks=pytest.mark.slow)])
def test_pallas_prep_bwd_matches_xla_and_float64(kd, vd, mode):
    b, t, h = 1, 48, 2
    args = prep_inputs(kd + vd, b, t, h, kd, vd, mode)
    cts = cotangents(1, out_shapes(b, t, h, kd, vd))
    xla = xla_vjp(args, cts)
    pallas = prep_vjp(args, cts)
    ref = float64_vjp(args, cts)
    for name, p, x, r in zip(NAMES, pallas, xla, ref):
        assert p.shape == x.shape and p.dtype == x.dtype, name
        assert rel(p, x) <= 1e-5, (name, rel(p, x))
        assert rel(p, r) <= 1e-5, (name, rel(p, r))


def test_pallas_prep_bwd_bf16_close_to_float64():
    b, t, h, kd, vd = 1, 32, 2, 32, 32
    args = prep_inputs(3, b, t, h, kd, vd)
    bf = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in args[:3]]
    args = (*bf, *args[3:])
    cts = cotangents(4, out_shapes(b, t, h, kd, vd))
    # the kernel's cotangents arrive in bf16: the reference sees the same rounded values
    cts = (*[np.asarray(jnp.asarray(c, jnp.bfloat16), np.float32) for c in cts[:3]], cts[3])
    got = prep_vjp(args, cts, jnp.bfloat16)
    ref = float64_vjp(args, cts)
    for name, a, r in zip(NAMES, got, ref):
        want = jnp.bfloat16 if name in ("dq", "dk", "dv") else jnp.float32
        assert a.dtype == want, name
        assert rel(a, r) <= 2e-2, (name, rel(a, r))


def test_gpu_gradient_runs_the_prep_backward_kernel():
    """gated_delta_rule's GPU gradient differentiates the preparation by the Pallas kernel
    (no triangular solve); fused_prep=False differentiates the XLA form (a solve)."""
    q, k, v, g, beta = prep_inputs(5, 1, 20, 1, 16, 16)

    def names(**kwargs):
        loss = lambda *a: jnp.sum(gdn.gated_delta_rule(  # noqa: E731
            *a, chunk_size=C, variant="gpu", **kwargs))
        text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta))
        return {name for name in ("gdn_chunk_prep_bwd", "triangular_solve") if name in text}

    assert names() == {"gdn_chunk_prep_bwd"}
    assert names(fused_prep=False) == {"triangular_solve"}


def test_bad_shapes_and_fused_prep_off_gpu_raise():
    q, k, v, g, beta = (jnp.asarray(x) for x in prep_inputs(6, 1, 16, 1, 16, 16))
    z = jnp.zeros
    with pytest.raises(ValueError, match="inverse has shape"):
        gdn_prep_bwd(q, k, v, g, beta, z((1, 16, 8)), z((1, 16, 16)), z((1, 16, 16)),
                     z((1, 16, C)), z((1, 1, 1, 1)), chunk=C, tuning=DEFAULT_TUNING)
    with pytest.raises(ValueError, match="fused_prep runs only on the 'gpu' variant"):
        gdn.gated_delta_rule(q, k, v, g, beta, chunk_size=C, variant="tpu", fused_prep=True)


def gdn_grads(args, dtype=jnp.float32, s0=None):
    """Gradients of <gated_delta_rule(...), ct> + <final state, cs> (variant "gpu": one
    custom VJP over the Pallas preparation and the recurrence)."""
    q, k, v, g, beta = args
    xs = (*(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(g), jnp.asarray(beta),
          jnp.asarray(s0))

    def f(q, k, v, g, beta, s0):
        return gdn.gated_delta_rule(q, k, v, g, beta, initial_state=s0, return_state=True,
                                    chunk_size=C, variant="gpu")

    (o, st), pull = jax.vjp(f, *xs)
    rng = np.random.default_rng(11)
    ct = jnp.asarray(rng.standard_normal(o.shape), o.dtype)
    cs = jnp.asarray(rng.standard_normal(st.shape), st.dtype)
    return o, st, pull((ct, cs))


def test_fused_vjp_has_no_separate_cotangent_sums():
    """The GPU gradient program adds no (B, T, H, K) cotangents outside the kernels: the
    recurrence's dq, dk are summed inside the preparation-backward kernel. (The XLA
    preparation, differentiated by XLA, sums them: 2 add_any.)"""
    from tests.kernels.jaxprs import equations

    def adds(**kwargs):
        q, k, v, g, beta = (jnp.asarray(x) for x in prep_inputs(23, 1, 32, 2, 16, 16))
        loss = lambda *a: jnp.sum(gdn.gated_delta_rule(  # noqa: E731
            *a, chunk_size=C, variant="gpu", **kwargs))
        jp = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
        return [e for e in equations(jp.jaxpr) if e.primitive.name == "add_any"
                and tuple(e.outvars[0].aval.shape) == q.shape]

    assert len(adds(fused_prep=False)) == 2
    assert adds() == []


def test_fused_vjp_bf16_close_to_float64():
    """bf16 inputs: the fused VJP's gradients are close to float64 autodiff of a lax.scan
    recurrence on the same (bf16-rounded) inputs."""
    from tests.kernels.test_pallas import jax_gdn64

    b, t, h, kd, vd = 1, 32, 2, 32, 32
    args = prep_inputs(24, b, t, h, kd, vd)
    args = (*[np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in args[:3]],
            *args[3:])
    s0 = np.zeros((b, h, kd, vd), np.float32)
    o, st, g2 = gdn_grads(args, jnp.bfloat16, s0)
    for name, a in zip(NAMES, g2):
        want = jnp.bfloat16 if name in ("dq", "dk", "dv") else jnp.float32
        assert a.dtype == want, name
    rng = np.random.default_rng(11)                    # gdn_grads' cotangents
    ct = np.asarray(jnp.asarray(rng.standard_normal(o.shape), o.dtype), np.float64)
    cs = rng.standard_normal(st.shape)
    with jax.enable_x64():
        loss = lambda *a: (jnp.sum(jax_gdn64(*a)[0] * ct)  # noqa: E731
                           + jnp.sum(jax_gdn64(*a)[1] * cs))
        ref = jax.grad(loss, argnums=tuple(range(6)))(
            *(jnp.asarray(x, jnp.float64) for x in (*args, s0)))
    for name, a, r in zip(NAMES, g2, ref):
        assert rel(a, r) <= 2e-2, (name, rel(a, r))
