"""The GDN preparation's Pallas backward (kernels.pallas.intra_bwd, selected by
kernels.pallas.gdn.PREP_BWD = "pallas") against the XLA backward it replaces (autodiff of
gdn.prep_xla with the saved inverse X) and against float64 autodiff of prep_xla with a
triangular solve (no saved inverse). Interpret mode on CPU; tiny shapes, chunk 16.
End-to-end gradients with both backwards: tests/kernels/test_pallas.py.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from kernels.pallas import gdn
from kernels.pallas.intra_bwd import gdn_intra_bwd

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


def prep_vjp(args, cts, prep_bwd, monkeypatch, dtype=jnp.float32):
    """Gradients of <prep_pallas(q, k, v, g, beta), cts> with the chosen backward."""
    monkeypatch.setattr(gdn, "PREP_BWD", prep_bwd)
    q, k, v, g, beta = args
    xs = (*(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(g), jnp.asarray(beta))
    outs, pull = jax.vjp(lambda *a: gdn.prep_pallas(*a, C), *xs)
    return pull(tuple(jnp.asarray(c, o.dtype) for c, o in zip(cts, outs)))


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
def test_pallas_prep_bwd_matches_xla_and_float64(kd, vd, mode, monkeypatch):
    b, t, h = 1, 48, 2
    args = prep_inputs(kd + vd, b, t, h, kd, vd, mode)
    cts = cotangents(1, out_shapes(b, t, h, kd, vd))
    xla = prep_vjp(args, cts, "xla", monkeypatch)
    pallas = prep_vjp(args, cts, "pallas", monkeypatch)
    ref = float64_vjp(args, cts)
    for name, p, x, r in zip(NAMES, pallas, xla, ref):
        assert p.shape == x.shape and p.dtype == x.dtype, name
        assert rel(p, x) <= 1e-6, (name, rel(p, x))
        assert rel(p, r) <= 1e-5, (name, rel(p, r))


def test_pallas_prep_bwd_bf16_close_to_float64(monkeypatch):
    b, t, h, kd, vd = 1, 32, 2, 32, 32
    args = prep_inputs(3, b, t, h, kd, vd)
    bf = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in args[:3]]
    args = (*bf, *args[3:])
    cts = cotangents(4, out_shapes(b, t, h, kd, vd))
    # the kernel's cotangents arrive in bf16: the reference sees the same rounded values
    cts = (*[np.asarray(jnp.asarray(c, jnp.bfloat16), np.float32) for c in cts[:3]], cts[3])
    got = prep_vjp(args, cts, "pallas", monkeypatch, jnp.bfloat16)
    ref = float64_vjp(args, cts)
    for name, a, r in zip(NAMES, got, ref):
        want = jnp.bfloat16 if name in ("dq", "dk", "dv") else jnp.float32
        assert a.dtype == want, name
        assert rel(a, r) <= 2e-2, (name, rel(a, r))


def prep_kernels_under_grad(prep_bwd, monkeypatch):
    """Names of the Pallas calls in the traced gradient of gated_delta_rule."""
    monkeypatch.setattr(gdn, "PREP_BWD", prep_bwd)
    q, k, v, g, beta = prep_inputs(5, 1, 20, 1, 16, 16)
    loss = lambda *a: jnp.sum(gdn.gated_delta_rule(*a, chunk_size=C, variant="gpu"))  # noqa: E731
    text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta))
    return {name for name in ("gdn_chunk_prep_bwd", "triangular_solve")
            if name in text}


def test_switch_selects_the_prep_backward(monkeypatch):
    assert prep_kernels_under_grad("pallas", monkeypatch) == {"gdn_chunk_prep_bwd"}
    # the XLA backward has no kernel (and no triangular solve: it uses the saved X)
    assert prep_kernels_under_grad("xla", monkeypatch) == set()


def test_unknown_switch_and_bad_shapes_raise(monkeypatch):
    with pytest.raises(ValueError, match="PREP_BWD"):
        prep_kernels_under_grad("triton", monkeypatch)
    q, k, v, g, beta = (jnp.asarray(x) for x in prep_inputs(6, 1, 16, 1, 16, 16))
    z = jnp.zeros
    with pytest.raises(ValueError, match="inverse has shape"):
        gdn_intra_bwd(q, k, v, g, beta, z((1, 16, 8)), z((1, 16, 16)), z((1, 16, 16)),
                      z((1, 16, C)), z((1, 1, 1, 1)), chunk=C)


def gdn_grads(args, fused, monkeypatch, dtype=jnp.float32, s0=None):
    """Gradients of <gated_delta_rule(...), ct> + <final state, cs> (variant "gpu", the
    fused Pallas preparation with the Pallas backward), with or without FUSED_VJP."""
    monkeypatch.setattr(gdn, "PREP_BWD", "pallas")
    monkeypatch.setattr(gdn, "FUSED_VJP", fused)
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


@pytest.mark.parametrize("mode", ["random", "edges"])
def test_fused_vjp_equals_the_two_custom_vjps(mode, monkeypatch):
    """FUSED_VJP (one custom VJP, the recurrence's dq, dk, dG summed inside the
    preparation-backward kernel) gives the same outputs and gradients as the two
    separate custom VJPs whose cotangents XLA sums (<= 1e-6, float32; T = 45 padded)."""
    b, t, h, kd, vd = 1, 45, 2, 16, 32
    args = prep_inputs(21, b, t, h, kd, vd, mode)
    s0 = np.random.default_rng(22).standard_normal((b, h, kd, vd)).astype(np.float32)
    o1, st1, g1 = gdn_grads(args, False, monkeypatch, s0=s0)
    o2, st2, g2 = gdn_grads(args, True, monkeypatch, s0=s0)
    np.testing.assert_array_equal(np.asarray(o1), np.asarray(o2))
    np.testing.assert_array_equal(np.asarray(st1), np.asarray(st2))
    for name, a, r in zip(NAMES + ("dstate",), g2, g1):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        assert rel(a, r) <= 1e-6, (name, rel(a, r))


def test_fused_vjp_has_no_separate_cotangent_sums(monkeypatch):
    """Under FUSED_VJP the gradient program adds no (B, T, H, K) cotangents outside the
    kernels; without it XLA sums dq and dk of the two paths (2 add_any)."""
    from tests.kernels.jaxprs import equations

    def adds(fused):
        monkeypatch.setattr(gdn, "PREP_BWD", "pallas")
        monkeypatch.setattr(gdn, "FUSED_VJP", fused)
        q, k, v, g, beta = (jnp.asarray(x) for x in prep_inputs(23, 1, 32, 2, 16, 16))
        loss = lambda *a: jnp.sum(gdn.gated_delta_rule(  # noqa: E731
            *a, chunk_size=C, variant="gpu"))
        jp = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
        return [e for e in equations(jp.jaxpr) if e.primitive.name == "add_any"
                and tuple(e.outvars[0].aval.shape) == q.shape]

    assert len(adds(False)) == 2
    assert adds(True) == []


def test_fused_vjp_bf16_close_to_unfused(monkeypatch):
    """bf16 inputs: the fused VJP's gradients are close to the two-VJP path's and to
    float64 autodiff of a lax.scan recurrence on the same (bf16-rounded) inputs."""
    from tests.kernels.test_pallas import jax_gdn64

    b, t, h, kd, vd = 1, 32, 2, 32, 32
    args = prep_inputs(24, b, t, h, kd, vd)
    args = (*[np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in args[:3]],
            *args[3:])
    s0 = np.zeros((b, h, kd, vd), np.float32)
    o, st, g1 = gdn_grads(args, False, monkeypatch, jnp.bfloat16, s0)
    _, _, g2 = gdn_grads(args, True, monkeypatch, jnp.bfloat16, s0)
    for name, a, r in zip(NAMES, g2, g1):
        assert a.dtype == r.dtype, name
        assert rel(a, r) <= 1e-2, (name, rel(a, r))   # one bf16 rounding fewer in dq, dk
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
