"""kernels.pallas (interpret mode on CPU) against float64 references.

Forward: a token-by-token float64 NumPy loop written here. Gradients: jax.grad of a
float64 lax.scan recurrence (also written here, independent of kernels/). Both kernel
variants run: "gpu" (the Triton-lowering program) and "tpu" (the Mosaic TPU program).
Shapes are tiny (interpret mode is slow): D = 16/32, chunk 16.
"""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp

C = 16
SLOW = pytest.mark.slow


ON_CPU = jax.default_backend() == "cpu"
NATIVE = "tpu" if jax.default_backend() == "tpu" else "gpu"


def cases(fast_gpu, all_cases):
    """On CPU (interpret mode) every case on the "tpu" program; the slower-to-interpret
    "gpu" program runs the cases in fast_gpu by default and the rest under -m slow.
    On an accelerator only the native program runs, compiled, on every case."""
    out = []
    for case in all_cases:
        if not ON_CPU:
            out.append(pytest.param(NATIVE, *case))
            continue
        out.append(pytest.param("tpu", *case))
        marks = () if case in fast_gpu else (SLOW,)
        out.append(pytest.param("gpu", *case, marks=marks))
    return out


# Settings each "gpu" case also runs with (beside the defaults): the XLA preparation
# (fused_prep=False, differentiated by XLA), the solve's products in IEEE float32 for
# every dtype, and value blocks forced to 32 columns (the whole value dim of these cases
# in one program per head; the default narrows them to 16 to fill the GPU). The "tpu"
# program takes none of them: one run.
GPU_SETTINGS = {
    "default": {},
    "xla_prep": {"fused_prep": False},
    "solve_highest": {"tuning": kp.Tuning(solve_precision="highest")},
    "block_v32": {"tuning": kp.Tuning(block_v=32)},
}


def with_settings(params, names=tuple(GPU_SETTINGS)):
    """Each "gpu" case once per setting in names, the "tpu" ones once ("default")."""
    out = []
    for p in params:
        for name in (names if p.values[0] == "gpu" else ("default",)):
            out.append(pytest.param(*p.values, name, marks=p.marks))
    return out


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ----------------------------------------------------------------------------- references

def np_gdn(q, k, v, g, beta, s0):
    """S_t = a_t (I - b_t k k^T) S + b_t k v^T ; o_t = S_t^T q_t, float64."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    b, t, h, kd = q.shape
    s = np.array(s0, np.float64)
    o = np.zeros(v.shape)
    for i in range(t):
        a = np.exp(g[:, i])[..., None, None]
        kt, vt, bt = k[:, i], v[:, i], beta[:, i][..., None, None]
        proj = np.eye(kd) - bt * kt[..., :, None] * kt[..., None, :]
        s = a * np.einsum("bhij,bhjv->bhiv", proj, s) + bt * kt[..., :, None] * vt[..., None, :]
        o[:, i] = np.einsum("bhk,bhkv->bhv", q[:, i], s)
    return o, s


def np_linear(q, k, v, g, s0, z0, normalize, eps):
    q, k, v, g = (np.asarray(x, np.float64) for x in (q, k, v, g))
    s, z = np.array(s0, np.float64), np.array(z0, np.float64)
    o = np.zeros(v.shape)
    for i in range(q.shape[1]):
        a = np.exp(g[:, i])
        s = a[..., None, None] * s + k[:, i][..., :, None] * v[:, i][..., None, :]
        z = a[..., None] * z + k[:, i]
        num = np.einsum("bhk,bhkv->bhv", q[:, i], s)
        o[:, i] = num / (np.einsum("bhk,bhk->bh", q[:, i], z)[..., None] + eps) if normalize \
            else num
    return o, s, z


def _no_starts(q):
    return jnp.zeros(q.shape[:2], bool)


def jax_gdn64(q, k, v, g, beta, s0, starts=None):
    """float64 lax.scan of the same recurrence, for gradients; starts (B, T) bool: the
    state is zeroed before those tokens (packed documents)."""
    def step(s, x):
        qt, kt, vt, gt, bt, st = x
        s = jnp.where(st[:, None, None, None], 0.0, s)
        s = jnp.exp(gt)[..., None, None] * s
        err = vt - jnp.einsum("bhk,bhkv->bhv", kt, s)
        s = s + bt[..., None, None] * kt[..., :, None] * err[..., None, :]
        return s, jnp.einsum("bhk,bhkv->bhv", qt, s)
    starts = _no_starts(q) if starts is None else starts
    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta, starts))
    s, o = jax.lax.scan(step, s0, xs)
    return jnp.moveaxis(o, 0, 1), s


def jax_linear64(q, k, v, g, s0, z0, normalize, eps, starts=None):
    def step(carry, x):
        s, z = carry
        qt, kt, vt, gt, st = x
        s = jnp.where(st[:, None, None, None], 0.0, s)
        z = jnp.where(st[:, None, None], 0.0, z)
        a = jnp.exp(gt)
        s = a[..., None, None] * s + kt[..., :, None] * vt[..., None, :]
        z = a[..., None] * z + kt
        num = jnp.einsum("bhk,bhkv->bhv", qt, s)
        out = num / (jnp.einsum("bhk,bhk->bh", qt, z)[..., None] + eps) if normalize else num
        return (s, z), out
    starts = _no_starts(q) if starts is None else starts
    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, starts))
    (s, z), o = jax.lax.scan(step, (s0, z0), xs)
    return jnp.moveaxis(o, 0, 1), s, z


# ----------------------------------------------------------------------------- inputs

def gdn_inputs(seed, b, t, h, kd, vd, beta_mode="random"):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, h, kd)).astype(np.float32)
    k = rng.standard_normal((b, t, h, kd)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)          # as in Gated DeltaNet
    v = rng.standard_normal((b, t, h, vd)).astype(np.float32)
    g = np.log(rng.uniform(0.7, 1.0, (b, t, h))).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (b, t, h)).astype(np.float32)
    if beta_mode == "edges":   # log_alpha and beta exactly at 0 and 1 in places
        g[:, ::3] = 0.0
        beta[:, ::2] = 1.0
        beta[:, 1::4] = 0.0
    s0 = (0.3 * rng.standard_normal((b, h, kd, vd))).astype(np.float32)
    return q, k, v, g, beta, s0


# ----------------------------------------------------------------------------- gated delta rule

@pytest.mark.parametrize("variant,t,beta_mode,setting", with_settings(cases(
    [(37, "random")], [(37, "random"), (1, "random"), (32, "edges")])))
def test_gdn_forward_and_grads_match_float64(variant, t, beta_mode, setting):
    kwargs = GPU_SETTINGS[setting]
    q, k, v, g, beta, s0 = gdn_inputs(t, 2, t, 2, 16, 32, beta_mode)
    # the kernels jitted, forward and gradients: one program each (eagerly, every op of
    # the interpreted kernels would compile and run alone, several times slower)
    o, st = jax.jit(functools.partial(kp.gated_delta_rule, return_state=True, chunk_size=C,
                                      variant=variant, **kwargs))(
        q, k, v, g, beta, initial_state=s0)
    ro, rst = np_gdn(q, k, v, g, beta, s0)
    assert o.dtype == jnp.float32 and st.dtype == jnp.float32
    assert rel(o, ro) <= 1e-5 and rel(st, rst) <= 1e-5

    rng = np.random.default_rng(1)
    co, cs = rng.standard_normal(ro.shape), rng.standard_normal(rst.shape)

    def loss(fn, dtype):
        def f(*xs):
            out, state = fn(*xs)
            return jnp.sum(out * co.astype(dtype)) + jnp.sum(state * cs.astype(dtype))
        return jax.grad(f, argnums=tuple(range(6)))

    got = jax.jit(loss(lambda *a: kp.gated_delta_rule(
        *a[:5], initial_state=a[5], return_state=True, chunk_size=C, variant=variant,
        **kwargs), np.float32))(q, k, v, g, beta, s0)
    with jax.enable_x64():
        ref = loss(jax_gdn64, np.float64)(*(jnp.asarray(x, jnp.float64)
                                            for x in (q, k, v, g, beta, s0)))
        ref = [np.asarray(r) for r in ref]
    for name, a, r in zip(["dq", "dk", "dv", "dlog_alpha", "dbeta", "ds0"], got, ref):
        assert rel(a, r) <= 1e-5, (name, rel(a, r))


def test_gdn_beta_one_orthonormal_keys_store_values_exactly():
    """With beta = 1, no decay and orthonormal keys the delta rule writes v_t into the
    state exactly, overwriting the previous value: querying with k_t returns v_t."""
    rng = np.random.default_rng(2)
    kd, t = 16, 16
    basis = np.linalg.qr(rng.standard_normal((kd, kd)))[0].astype(np.float32)
    keys = basis[np.arange(t) % 8]                      # 8 keys, each written twice
    k = keys[None, :, None, :]
    v = rng.standard_normal((1, t, 1, 16)).astype(np.float32)
    ones, zeros = np.ones((1, t, 1), np.float32), np.zeros((1, t, 1), np.float32)
    _, st = kp.gated_delta_rule(k, k, v, zeros, ones, return_state=True, chunk_size=C,
                                variant=NATIVE)
    recalled = keys[8:] @ np.asarray(st)[0, 0]          # the second writes won
    np.testing.assert_allclose(recalled, v[0, 8:, 0], atol=1e-5)


# ----------------------------------------------------------------------------- linear attention

def linear_inputs(seed, t, decay, normalize, b=2, h=2, f=16, dv=32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, h, f)).astype(np.float32)
    k = rng.standard_normal((b, t, h, f)).astype(np.float32)
    if normalize:   # positive features, as a feature map gives
        q, k = np.exp(0.5 * q), np.exp(0.5 * k)
    v = rng.standard_normal((b, t, h, dv)).astype(np.float32)
    if decay is None:
        ld, g = None, np.zeros((b, t, h), np.float32)
    elif decay == "heads":
        ld = np.log(rng.uniform(0.8, 1.0, (h,))).astype(np.float32)
        g = np.broadcast_to(ld, (b, t, h))
    else:
        ld = g = np.log(rng.uniform(0.7, 1.0, (b, t, h))).astype(np.float32)
    s0 = (0.3 * rng.standard_normal((b, h, f, dv))).astype(np.float32)
    z0 = rng.uniform(0.5, 1.5, (b, h, f)).astype(np.float32)
    return q, k, v, ld, np.asarray(g, np.float32), s0, z0


@pytest.mark.parametrize("variant,normalize,decay,t,setting", with_settings(cases(
    [(True, "tokens", 37)],
    [(False, None, 37), (False, "tokens", 37), (True, None, 1), (True, "tokens", 37),
     (True, "heads", 16)]), names=("default", "block_v32")))
def test_linear_forward_and_grads_match_float64(variant, normalize, decay, t, setting):
    tuning = GPU_SETTINGS[setting].get("tuning", kp.DEFAULT_TUNING)
    eps = 1e-6
    q, k, v, ld, g, s0, z0 = linear_inputs(t, t, decay, normalize)
    init = (s0, z0) if normalize else s0
    o, state = jax.jit(functools.partial(
        kp.linear_attention, normalize=normalize, eps=eps, return_state=True, chunk_size=C,
        variant=variant, tuning=tuning))(q, k, v, log_decay=ld, initial_state=init)
    ro, rs, rz = np_linear(q, k, v, g, s0, z0 if normalize else 0 * z0, normalize, eps)
    assert rel(o, ro) <= 1e-5
    if normalize:
        assert rel(state[0], rs) <= 1e-5 and rel(state[1], rz) <= 1e-5
    else:
        assert rel(state, rs) <= 1e-5

    rng = np.random.default_rng(3)
    co, cs, cz = (rng.standard_normal(x.shape) for x in (ro, rs, rz))

    def loss_of(out, s, z, dtype):
        val = jnp.sum(out * co.astype(dtype)) + jnp.sum(s * cs.astype(dtype))
        return val + jnp.sum(z * cz.astype(dtype)) if normalize else val

    def mine(q, k, v, g, s0, z0):
        out, st = kp.linear_attention(q, k, v, normalize=normalize, eps=eps,
                                      log_decay=None if decay is None else g,
                                      initial_state=(s0, z0) if normalize else s0,
                                      return_state=True, chunk_size=C, variant=variant,
                                      tuning=tuning)
        s, z = st if normalize else (st, None)
        return loss_of(out, s, z, np.float32)

    def ref_fn(q, k, v, g, s0, z0):
        out, s, z = jax_linear64(q, k, v, g, s0, z0, normalize, eps)
        return loss_of(out, s, z, np.float64)

    # gradient w.r.t. a per-token decay only where the op takes one
    g_in = g if decay != "heads" else ld
    got = jax.jit(jax.grad(mine, argnums=tuple(range(6))))(
        q, k, v, g_in if decay else g, s0, z0)
    with jax.enable_x64():
        def ref_wrapped(q, k, v, gg, s0, z0):
            gt = jnp.broadcast_to(gg, q.shape[:3]) if decay == "heads" else gg
            return ref_fn(q, k, v, gt, s0, z0)
        ref = jax.grad(ref_wrapped, argnums=tuple(range(6)))(
            *(jnp.asarray(x, jnp.float64) for x in (q, k, v, g_in if decay else g, s0, z0)))
        ref = [np.asarray(r) for r in ref]
    names = ["dq", "dk", "dv", "dlog_decay", "ds0", "dz0"]
    checks = [0, 1, 2, 4] + ([3] if decay else []) + ([5] if normalize else [])
    for i in checks:
        assert rel(got[i], ref[i]) <= 1e-5, (names[i], rel(got[i], ref[i]))


# ----------------------------------------------------------------------------- bf16, decode, errors

def test_bf16_inputs_close_to_float32_reference():
    q, k, v, g, beta, s0 = gdn_inputs(5, 1, 40, 2, 32, 32)
    bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
    o, st = kp.gated_delta_rule(bf(q), bf(k), bf(v), g, beta, initial_state=s0,
                                return_state=True, chunk_size=C)
    assert o.dtype == jnp.bfloat16 and st.dtype == jnp.float32
    ro, rst = np_gdn(*(np.asarray(bf(x), np.float32) for x in (q, k, v)), g, beta, s0)
    assert rel(np.asarray(o, np.float32), ro) <= 1e-2 and rel(st, rst) <= 1e-2


def test_decode_steps_match_float64_step():
    if jax.default_backend() == "tpu":
        pytest.skip("the Pallas decode step is a GPU (Triton) kernel")
    q, k, v, g, beta, s0 = gdn_inputs(6, 3, 1, 2, 16, 32)
    ro, rst = np_gdn(q, k, v, g, beta, s0)
    args = (q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0])
    o, st = kp.gated_delta_step(*args, jnp.asarray(s0))
    assert rel(o, ro[:, 0]) <= 1e-5 and rel(st, rst) <= 1e-5
    o, st = kp.gated_delta_step_pallas(*args, jnp.array(s0), block_v=16)
    assert rel(o, ro[:, 0]) <= 1e-5 and rel(st, rst) <= 1e-5


def test_unsupported_inputs_raise_not_implemented():
    q, k, v, g, beta, _ = gdn_inputs(7, 1, 8, 1, 16, 16)
    with pytest.raises(NotImplementedError, match="power-of-two"):
        kp.linear_attention(q[..., :12], k[..., :12], v, normalize=False)
    wide = jnp.zeros((*q.shape[:-1], 512), q.dtype)
    with pytest.raises(NotImplementedError, match="from 16 to 256, got 512"):
        kp.linear_attention(wide, wide, v, normalize=False)
    with pytest.raises(NotImplementedError, match="chunk_size"):
        kp.gated_delta_rule(q, k, v, g, beta, chunk_size=24)


def test_ops_dispatches_pallas():
    ops = pytest.importorskip("kernels.ops")
    q, k, v, g, beta, s0 = gdn_inputs(8, 1, 20, 2, 16, 16)
    o = ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, impl="pallas", chunk_size=C)
    assert rel(o, np_gdn(q, k, v, g, beta, s0)[0]) <= 1e-5
