"""What the GDN forward moves through memory: structural checks on the traced program
(which Pallas calls run, with which outputs), plus value checks that the leaner paths
compute the same numbers. Tracing only (make_jaxpr) except where values are compared.
"""
import numpy as np

import jax
import jax.numpy as jnp

import kernels.pallas as kp
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


def test_forward_without_grad_does_not_write_the_float32_inverse():
    """X = (I + A)^-1 in float32 ((B*H, Tp, C)) is only for the backward: X passes between
    the preparation's two kernels either way, in the input dtype (bf16 here) without a
    gradient and in float32 under one."""
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
    assert len(fwd) == len(grad) == 2
    fwd_out = [o for e in fwd for o in outputs(e)]
    grad_out = [o for e in grad for o in outputs(e)]
    assert fwd_out.count(inverse) == 0 and grad_out.count(inverse) == 1
    assert fwd_out.count(lean_x) == grad_out.count(lean_x) + 1   # X, then P
    assert (sum(map(written_bytes, grad)) - sum(map(written_bytes, fwd))
            == B * H * tp * C * (4 - 2))


def test_no_grad_forward_equals_grad_path_primal():
    """The lean forward (no X) and the forward under jax.vjp (X written) give the same
    output bit for bit."""
    args = inputs(2)
    lean = jax.jit(gdn)(*args)
    primal, _ = jax.vjp(gdn, *args)
    np.testing.assert_array_equal(np.asarray(lean, np.float32), np.asarray(primal, np.float32))


def test_forward_writes_only_w_ut_p_and_recurrence_reads_q_k_in_place():
    """The preparation hands the recurrence W, Ut, P (input dtype) and G_C, nothing per
    token beyond (K + V + C) values (X, C values per token, passes between its two
    kernels); Qg, Kd are formed in the recurrence from q, k, read in their (B, Tp, H, K)
    layout (no transposed copy) and G (B, Tp, H) float32."""
    args = inputs()
    tp = -(-T // C) * C
    eqns = pallas_calls(jax.make_jaxpr(lambda *a: gdn(*a))(*args))
    (solve,) = exactly(eqns, "gdn_chunk_prep_kkt_solve")
    (wu,), (rec,) = exactly(eqns, "gdn_chunk_prep_wu"), named(eqns, "linear_chunk_fwd")
    assert written_bytes(wu) == B * H * tp * (K + V + C) * 2        # bf16 W, Ut, P
    assert written_bytes(solve) == B * H * tp * C * 2 + B * H * (tp // C) * 4   # X, G_C
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
    forward under a gradient is split: a sequential pass saving the chunk-start states
    and U = Ut - W S in the input dtype, then a chunk-parallel output pass."""
    args = inputs(4)
    tp = -(-T // C) * C
    n = tp // C
    loss = lambda *a: jnp.sum(gdn(*a).astype(jnp.float32))  # noqa: E731
    eqns = pallas_calls(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args))
    bf16, f32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
    (fwd,) = named(eqns, "linear_chunk_fwd_states")
    assert outputs(fwd) == [((B * H, K, V), f32), ((B * H, n, K, V), bf16),  # final, saved
                            ((B * H, tp, V), bf16)]                          # states; U
    (out,) = named(eqns, "linear_chunk_fwd_output")
    assert outputs(out) == [((B, tp, H, V), bf16)]
    assert not exactly(eqns, "linear_chunk_fwd")  # the one-loop forward is not used
    (state_pass,) = named(eqns, "linear_chunk_bwd_dstate")
    assert outputs(state_pass) == [((B * H, tp, V), bf16), ((B * H, n, K, V), bf16),
                                   ((B * H, K, V), f32)]
    (grads,) = named(eqns, "linear_chunk_bwd_grads")
    assert outputs(grads) == [((B, tp, H, K), bf16), ((B, tp, H, K), bf16),
                              ((B * H, tp, K), bf16), ((B * H, tp, C), bf16),
                              ((B * H, n, 1, 1), f32), ((B, tp, H), f32)]
    assert not exactly(eqns, "linear_chunk_bwd")  # the fused (TPU) backward is not used
