"""What the GDN forward moves through memory: structural checks on the traced program
(which Pallas calls run, with which outputs), plus value checks that the leaner paths
compute the same numbers. Tracing only (make_jaxpr) except where values are compared.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from kernels.pallas import intra
from kernels.pallas.intra import gdn_intra
from tests.kernels import reference
from tests.kernels.jaxprs import equations

C = 16
B, T, H, K, V = 1, 37, 2, 32, 32


def pallas_calls(closed_jaxpr):
    """Every pallas_call equation in a jaxpr, including inside custom_vjp/jit bodies."""
    return [e for e in equations(closed_jaxpr.jaxpr) if e.primitive.name == "pallas_call"]


def named(eqns, name):
    return [e for e in eqns if name in str(e.params.get("name", ""))]


def exactly(eqns, name):
    return [e for e in eqns if str(e.params.get("name", "")) == name]


def outputs(eqn):
    return [(tuple(v.aval.shape), jnp.dtype(v.aval.dtype)) for v in eqn.outvars]


def written_bytes(eqn):
    return sum(int(np.prod(s)) * d.itemsize for s, d in outputs(eqn))


def inputs(seed=0, dtype=jnp.bfloat16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, H, V))
    g = np.log(rng.uniform(0.7, 1.0, (B, T, H))).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (B, T, H)).astype(np.float32)
    return (*(jnp.asarray(x, dtype) for x in (q, k, v)), g, beta)


def gdn(*args):
    return kp.gated_delta_rule(*args, chunk_size=C, variant="gpu")


@pytest.mark.parametrize("kernels", intra.PREP_KERNELS_CHOICES)
def test_forward_without_grad_does_not_write_the_float32_inverse(kernels, monkeypatch):
    """X = (I + A)^-1 in float32 ((B*H, Tp, C)) is only for the backward. One-kernel
    preparation (PREP_KERNELS = 1): the no-grad forward has no such output, under jax.grad
    exactly one. Two or three kernels: X passes between kernels either way, in the input
    dtype (bf16 here) without a gradient and in float32 under one."""
    monkeypatch.setattr(intra, "PREP_KERNELS", kernels)
    args = inputs()
    tp = -(-T // C) * C
    inverse = ((B * H, tp, C), jnp.dtype(jnp.float32))
    lean_x = ((B * H, tp, C), jnp.dtype(jnp.bfloat16))    # P has this shape and dtype too

    def preparation(eqns):   # the forward preparation's calls (not its backward's)
        return [e for e in named(eqns, "gdn_chunk_prep")
                if "prep_bwd" not in str(e.params.get("name"))]

    # fresh functions: make_jaxpr must not reuse a trace made under another setting
    fwd = preparation(pallas_calls(jax.make_jaxpr(lambda *a: gdn(*a))(*args)))
    loss = lambda *a: jnp.sum(gdn(*a).astype(jnp.float32))  # noqa: E731
    grad = preparation(pallas_calls(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*args)))
    assert len(fwd) == len(grad) == {1: 1, 2: 2, 3: 3}[kernels]
    fwd_out = [o for e in fwd for o in outputs(e)]
    grad_out = [o for e in grad for o in outputs(e)]
    # (three kernels also pass A, float32 and X's shape, from K K^T to the solve)
    assert fwd_out.count(inverse) == (1 if kernels == 3 else 0)
    assert grad_out.count(inverse) == fwd_out.count(inverse) + 1
    if kernels == 1:
        assert len(grad_out) == len(fwd_out) + 1
        # the bytes the no-grad preparation saves: exactly X's
        assert (sum(map(written_bytes, grad)) - sum(map(written_bytes, fwd))
                == B * H * tp * C * 4)
    else:
        assert fwd_out.count(lean_x) == grad_out.count(lean_x) + 1   # X, then P
        assert (sum(map(written_bytes, grad)) - sum(map(written_bytes, fwd))
                == B * H * tp * C * (4 - 2))


def test_intra_kernel_outputs_do_not_depend_on_with_inverse():
    q, k, v, g, beta = inputs(1, jnp.float32)
    tp = 48
    pad = lambda x: jnp.pad(x, [(0, 0), (0, tp - T)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
    q, k, v, g, beta = map(pad, (q, k, v, g, beta))
    big_g = jnp.cumsum(g.reshape(B, tp // C, C, H), axis=2).reshape(B, tp, H)
    lean = gdn_intra(q, k, v, big_g, beta, chunk=C, with_inverse=False)
    full = gdn_intra(q, k, v, big_g, beta, chunk=C, with_inverse=True)
    assert len(full) == len(lean) + 1
    for a, b in zip(lean, full):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and the saved inverse is (I + A)^-1 per chunk, against float64 NumPy
    x = np.asarray(full[-1], np.float64).reshape(B, H, tp // C, C, C)
    a = reference.chunk_ut_matrix(k, big_g, beta, C)
    np.testing.assert_allclose(x @ (np.eye(C) + a), np.broadcast_to(np.eye(C), x.shape),
                               atol=1e-5)


def test_no_grad_forward_equals_grad_path_primal():
    """The lean forward (no X) and the forward under jax.vjp (X written) give the same
    output bit for bit."""
    args = inputs(2)
    lean = jax.jit(gdn)(*args)
    primal, _ = jax.vjp(gdn, *args)
    np.testing.assert_array_equal(np.asarray(lean, np.float32), np.asarray(primal, np.float32))


def test_forward_writes_only_w_ut_p_and_recurrence_reads_q_k_in_place(monkeypatch):
    """The preparation writes W, Ut, P (input dtype) and G_C, nothing per token beyond
    (K + V + C) values; Qg, Kd are formed in the recurrence from q, k, read in their
    (B, Tp, H, K) layout (no transposed copy) and G (B, Tp, H) float32."""
    monkeypatch.setattr(intra, "PREP_KERNELS", 1)   # the one-kernel preparation's bytes
    args = inputs()
    tp = -(-T // C) * C
    eqns = pallas_calls(jax.make_jaxpr(lambda *a: gdn(*a))(*args))
    (prep,), (rec,) = named(eqns, "gdn_chunk_prep"), named(eqns, "linear_chunk_fwd")
    per_token = B * H * tp * (K + V + C) * 2            # bf16 W, Ut, P
    assert written_bytes(prep) == per_token + B * H * (tp // C) * 4
    rec_in = [(tuple(v.aval.shape), jnp.dtype(v.aval.dtype)) for v in rec.invars]
    assert rec_in.count(((B, tp, H, K), jnp.dtype(jnp.bfloat16))) == 2      # q, k
    assert ((B, tp, H), jnp.dtype(jnp.float32)) in rec_in                   # G
    assert ((B * H, tp, K), jnp.dtype(jnp.bfloat16)) in rec_in              # W only


def test_linear_attention_without_decay_passes_no_decay_to_the_kernel():
    """No log_decay: the recurrence gets no G input (static: no exp of zeros)."""
    q, k, v, _, _ = inputs(3)

    def fwd(variant, log_decay):
        return lambda q, k, v: kp.linear_attention(q, k, v, normalize=False,
                                                   log_decay=log_decay, chunk_size=C,
                                                   variant=variant)

    for variant in ("gpu", "tpu"):
        plain = named(pallas_calls(jax.make_jaxpr(fwd(variant, None))(q, k, v)),
                      "linear_chunk_fwd")[0]
        decayed = named(pallas_calls(jax.make_jaxpr(
            fwd(variant, jnp.full((H,), -0.1)))(q, k, v)), "linear_chunk_fwd")[0]
        assert len(decayed.invars) == len(plain.invars) + 1


def test_gpu_backward_is_a_state_pass_and_a_chunk_parallel_pass():
    """The GPU backward: a sequential pass writing dU and the per-chunk dS' in the input
    dtype (bf16 here), then one chunk-parallel call writing dq, dk in the inputs' own
    (B, Tp, H, K) layout with the decay chain applied (dG as (B, Tp, H) float32): no
    float32 per-value-block partials of the K-sided gradients to sum afterwards. The
    forward under a gradient is split (recurrence.SPLIT_FWD = "grad"): a sequential pass
    saving the chunk-start states and U = Ut - W S in the input dtype, then a
    chunk-parallel output pass."""
    args = inputs(4)
    tp = -(-T // C) * C
    n = tp // C
    loss = lambda *a: jnp.sum(gdn(*a).astype(jnp.float32))  # noqa: E731
    eqns = pallas_calls(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args))
    bf16, f32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
    (fwd,) = named(eqns, "linear_chunk_fwd_states")     # (one segment: the final state)
    assert outputs(fwd) == [((B * H, 1, K, V), f32), ((B * H, n, K, V), bf16),  # final,
                            ((B * H, tp, V), bf16)]                        # saved states; U
    (out,) = named(eqns, "linear_chunk_fwd_output")
    assert outputs(out) == [((B, tp, H, V), bf16)]
    assert not exactly(eqns, "linear_chunk_fwd")  # the one-loop forward is not used
    (state_pass,) = named(eqns, "linear_chunk_bwd_dstate")
    assert outputs(state_pass) == [((B * H, tp, V), bf16), ((B * H, n, K, V), bf16),
                                   ((B * H, 1, K, V), f32)]
    (grads,) = named(eqns, "linear_chunk_bwd_grads")
    assert outputs(grads) == [((B, tp, H, K), bf16), ((B, tp, H, K), bf16),
                              ((B * H, tp, K), bf16), ((B * H, tp, C), bf16),
                              ((B * H, n, 1, 1), f32), ((B, tp, H), f32)]
    assert not exactly(eqns, "linear_chunk_bwd")  # the fused (TPU) backward is not used


def test_segments_make_both_sequential_passes_two_level(monkeypatch):
    """recurrence.SEQ_SEGMENTS = 3 (T = 37, chunk 16: 3 chunks, so 3 segments): the
    forward's state pass and the backward's dS pass each get a segment-map pass in front
    (a K-column wider output: value columns and the transition's), and run with a
    segment grid axis; the one-loop forward is not used even without a gradient."""
    from kernels.pallas import recurrence
    monkeypatch.setattr(recurrence, "SEQ_SEGMENTS", 3)
    args = inputs(6)
    loss = lambda *a: jnp.sum(gdn(*a).astype(jnp.float32))  # noqa: E731
    eqns = pallas_calls(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args))
    f32 = jnp.dtype(jnp.float32)
    for name in ("linear_chunk_fwd_segment_maps", "linear_chunk_bwd_segment_maps"):
        (maps,) = exactly(eqns, name)
        assert outputs(maps) == [((B * H, 3, K, V + K), f32)], name
    (states,) = exactly(eqns, "linear_chunk_fwd_states")
    assert outputs(states)[0] == ((B * H, 3, K, V), f32)      # each segment's end state
    plain = pallas_calls(jax.make_jaxpr(lambda *a: gdn(*a))(*args))  # (a fresh trace)
    assert exactly(plain, "linear_chunk_fwd_segment_maps")
    assert not exactly(plain, "linear_chunk_fwd")
