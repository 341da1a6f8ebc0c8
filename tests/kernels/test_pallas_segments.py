"""kernels.pallas with segment_ids (packed documents) against float64 references: the
token loops of tests/kernels/reference.py for outputs and final states, and jax.grad of a
float64 lax.scan that zeroes the state at each document start for the gradients of every
input. Both programs ("gpu" and "tpu", interpret mode on CPU) and the GPU path's XLA
preparation. Chunk 32 (two 16-row blocks of the UT transform per chunk), T = 70 (padded).

Rows: boundaries at a chunk start (32), mid-chunk and mid-block (40, 5), one-token
documents (at 0 and at 40), a document spanning three chunks (row 1, from 5), ids that do
not start at 0 (row 1 starts at 7) and a row that is one document (row 2).
"""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from tests.kernels import reference, test_pallas

C = 32
B, T, H, K, V = 3, 70, 2, 16, 32
ON_CPU = jax.default_backend() == "cpu"
NATIVE = "tpu" if jax.default_backend() == "tpu" else "gpu"
# (variant, fused_prep): the GPU program with its Pallas preparation and with the XLA
# one, and the TPU program
PROGRAMS = ([("gpu", None), ("gpu", False), ("tpu", None)] if ON_CPU
            else [(NATIVE, None), (NATIVE, False)] if NATIVE == "gpu" else [(NATIVE, None)])


def segment_ids():
    row0 = [1] + [2] * 31 + [3] * 8 + [4] + [5] * 29
    row1 = [7] * 5 + [9] * 65
    row2 = [3] * T
    return np.array([row0, row1, row2], np.int32)


def starts_of(seg):
    starts = np.zeros(seg.shape, bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return starts


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def gdn_inputs(seed):
    return test_pallas.gdn_inputs(seed, B, T, H, K, V)


def grads64(loss_of_outputs, fn64, args):
    with jax.enable_x64():
        ref = jax.grad(lambda *a: loss_of_outputs(fn64(*a), np.float64),
                       argnums=tuple(range(len(args))))(
            *(jnp.asarray(x, jnp.float64) for x in args))
        return [np.asarray(r) for r in ref]


def check_gdn_against_float64(seg, inputs, kw, seed):
    """kernels.pallas.gated_delta_rule(**kw) with packed documents `seg` against the
    float64 references: outputs and final state (the token loop), and the gradients of
    every input for a random cotangent from `seed` (jax.grad of the float64 scan)."""
    q, k, v, g, beta, s0 = inputs
    # jitted: one program each way (eagerly, every op of the interpreted kernels would
    # compile and run alone, several times slower on a CPU)
    o, st = jax.jit(functools.partial(kp.gated_delta_rule, return_state=True, **kw))(
        q, k, v, g, beta, initial_state=s0)
    ro, rst = reference.gated_delta_rule(q, k, v, g, beta, segment_ids=seg,
                                         initial_state=s0)
    assert rel(o, ro) <= 1e-5 and rel(st, rst) <= 1e-5

    rng = np.random.default_rng(seed)
    co, cs = rng.standard_normal(ro.shape), rng.standard_normal(rst.shape)

    def loss(outs, dtype):
        out, state = outs
        return jnp.sum(out * co.astype(dtype)) + jnp.sum(state * cs.astype(dtype))

    got = jax.jit(jax.grad(lambda *a: loss(kp.gated_delta_rule(
        *a[:5], initial_state=a[5], return_state=True, **kw), np.float32),
        argnums=tuple(range(6))))(q, k, v, g, beta, s0)
    ref = grads64(loss, lambda *a: test_pallas.jax_gdn64(*a, starts_of(seg)), inputs)
    for name, a, r in zip(["dq", "dk", "dv", "dlog_alpha", "dbeta", "ds0"], got, ref):
        assert rel(a, r) <= 1e-5, (name, rel(a, r))


@pytest.mark.parametrize("variant,fused_prep", PROGRAMS)
def test_gdn_with_segments_matches_float64(variant, fused_prep):
    seg = segment_ids()
    check_gdn_against_float64(seg, gdn_inputs(0), dict(
        segment_ids=seg, chunk_size=C, variant=variant, fused_prep=fused_prep), seed=1)


LINEAR_CASES = [(True, "tokens"), (False, None), (True, None), (False, "heads")]


@pytest.mark.parametrize("variant", sorted({p[0] for p in PROGRAMS}))
@pytest.mark.parametrize("normalize,decay", LINEAR_CASES)
def test_linear_with_segments_matches_float64(variant, normalize, decay):
    seg = segment_ids()
    q, k, v, ld, g, s0, z0 = test_pallas.linear_inputs(2, T, decay, normalize, B, H, K, V)
    eps = 1e-6
    init = (s0, z0) if normalize else s0
    kw = dict(normalize=normalize, eps=eps, segment_ids=seg, chunk_size=C, variant=variant)
    o, state = jax.jit(functools.partial(kp.linear_attention, return_state=True, **kw))(
        q, k, v, log_decay=ld, initial_state=init)
    ro, rs, rz = reference.linear_attention(q, k, v, normalize=normalize, eps=eps,
                                            log_decay=ld, segment_ids=seg,
                                            initial_state=init)
    assert rel(o, ro) <= 1e-5
    got_s = state[0] if normalize else state
    assert rel(got_s, rs) <= 1e-5
    if normalize:
        assert rel(state[1], rz) <= 1e-5

    co, cs, cz = (np.random.default_rng(3).standard_normal(x.shape) for x in (ro, rs, rz))

    def loss(outs, dtype):
        out, s, z = outs
        val = jnp.sum(out * co.astype(dtype)) + jnp.sum(s * cs.astype(dtype))
        return val + jnp.sum(z * cz.astype(dtype)) if normalize else val

    def mine(q, k, v, g, s0, z0):
        out, st = kp.linear_attention(q, k, v, log_decay=None if decay is None else g,
                                      initial_state=(s0, z0) if normalize else s0,
                                      return_state=True, **kw)
        s, z = st if normalize else (st, None)
        return out, s, z

    g_in = ld if decay == "heads" else g
    got = jax.jit(jax.grad(lambda *a: loss(mine(*a), np.float32),
                           argnums=tuple(range(6))))(q, k, v, g_in, s0, z0)
    starts = starts_of(seg)

    def ref_fn(q, k, v, gg, s0, z0):
        gt = jnp.broadcast_to(gg, q.shape[:3])
        return test_pallas.jax_linear64(q, k, v, gt, s0, z0 if normalize else 0 * z0,
                                        normalize, eps, starts)
    ref = grads64(loss, ref_fn, (q, k, v, g_in, s0, z0))
    names = ["dq", "dk", "dv", "dlog_decay", "ds0", "dz0"]
    checks = [0, 1, 2, 4] + ([3] if decay else []) + ([5] if normalize else [])
    for i in checks:
        assert rel(got[i], ref[i]) <= 1e-5, (names[i], rel(got[i], ref[i]))


def test_single_document_rows_equal_no_segments():
    """Rows that are one document each give what no segment ids give (every program)."""
    q, k, v, g, beta, s0 = gdn_inputs(4)
    one = np.full((B, T), 5, np.int32)
    for variant, fused_prep in PROGRAMS:
        kw = dict(chunk_size=C, variant=variant, fused_prep=fused_prep, initial_state=s0)
        a = kp.gated_delta_rule(q, k, v, g, beta, segment_ids=one, **kw)
        b = kp.gated_delta_rule(q, k, v, g, beta, **kw)
        assert rel(a, b) <= 1e-6, variant


def test_bf16_with_segments_close_to_float32_reference():
    seg = segment_ids()
    q, k, v, g, beta, s0 = gdn_inputs(5)
    bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
    o, st = kp.gated_delta_rule(bf(q), bf(k), bf(v), g, beta, initial_state=s0,
                                return_state=True, chunk_size=C, segment_ids=seg,
                                variant=NATIVE if not ON_CPU else "gpu")
    assert o.dtype == jnp.bfloat16
    ro, rst = reference.gated_delta_rule(*(np.asarray(bf(x), np.float32) for x in (q, k, v)),
                                         g, beta, segment_ids=seg, initial_state=s0)
    assert rel(np.asarray(o, np.float32), ro) <= 1e-2 and rel(st, rst) <= 1e-2


def test_segment_ids_of_the_wrong_shape_are_refused():
    q, k, v, g, beta, _ = gdn_inputs(6)
    with pytest.raises(ValueError, match="segment_ids must be"):
        kp.gated_delta_rule(q, k, v, g, beta, segment_ids=np.zeros((B, T - 1), np.int32),
                            chunk_size=C)


def test_vmapped_over_population_members_equals_separate_calls():
    """training.population vmaps the step over members: the GPU program's pallas_calls
    and custom VJP under jax.vmap, with each member's own packed documents, give each
    member's separate call exactly (loss and every input's gradient). NIAH populations
    train gated_deltanet this way (session 36 checked it after a member learned no
    needles)."""
    rng = np.random.default_rng(3)
    members = 2
    q, k, v = (jnp.asarray(rng.normal(size=(members, 1, T, H, d)), jnp.float32)
               for d in (K, K, V))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    g = -0.1 * jnp.abs(jnp.asarray(rng.normal(size=(members, 1, T, H)), jnp.float32))
    beta = jax.nn.sigmoid(jnp.asarray(rng.normal(size=(members, 1, T, H)), jnp.float32))
    seg = jnp.asarray(segment_ids()[:members, None], jnp.int32)
    weights = jnp.cos(jnp.arange(T * H * V, dtype=jnp.float32)).reshape(1, T, H, V)

    def loss(*args):
        *xs, s = args
        o = kp.gated_delta_rule(*xs, chunk_size=C, segment_ids=s, variant=PROGRAMS[0][0])
        return jnp.sum(o * weights)
    step = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))
    together, grads = jax.vmap(step)(q, k, v, g, beta, seg)
    for m in range(members):
        alone, alone_grads = step(q[m], k[m], v[m], g[m], beta[m], seg[m])
        np.testing.assert_allclose(float(together[m]), float(alone), rtol=1e-6)
        for a, b in zip(alone_grads, grads):
            np.testing.assert_allclose(np.asarray(b[m]), np.asarray(a), rtol=1e-5, atol=1e-6)
