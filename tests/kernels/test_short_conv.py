"""kernels.pallas.short_conv (the delta-rule mixers' fused conv + SiLU + L2 norm + scale)
against a float64 NumPy transcription of the formula and against the XLA form the
mixers run elsewhere (models.layers.conv_silu_norm on a CPU): outputs and gradients (x
and the conv weights), packed documents, lengths that are not a multiple of the row
block, conv sizes that are not a power of two, bf16 inputs. Interpret mode; the Triton
lowering of both programs is checked as in test_pallas_gpu_lowering."""
import math

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import ops
from kernels.pallas import common, short_conv
from models import layers
from models.config import ModelConfig

H, D = 2, 16
C = H * D
NORMALIZE = (True, True, False)
SCALE = (1.0 / math.sqrt(D), 1.0, 1.0)


def reference(x, w, segment_ids, eps=1e-6):
    """float64 NumPy: y_n[t] = scale_n nrm_n(silu(sum_j w[j] x[t - back_j])), taps kept
    inside each document."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    b, t, n_in, c = x.shape
    taps = w.shape[0]
    seg = np.zeros((b, t), int) if segment_ids is None else np.asarray(segment_ids)
    pre = np.zeros_like(x)
    for bi in range(b):
        for ti in range(t):
            for j in range(taps):
                src = ti - (taps - 1 - j)
                if src >= 0 and seg[bi, src] == seg[bi, ti]:
                    pre[bi, ti] += w[j] * x[bi, src]
    y = pre / (1 + np.exp(-pre))
    outs = []
    for n in range(n_in):
        yn = y[:, :, n].reshape(b, t, -1, D)
        if NORMALIZE[n]:
            yn = yn / np.sqrt(np.sum(yn * yn, -1, keepdims=True) + eps)
        outs.append((yn * SCALE[n]).reshape(b, t, c))
    return outs


def fused(x, w, segment_ids, block_t, dpre_dtype="float32"):
    positions = jnp.broadcast_to(layers.segment_positions(segment_ids, x.shape[1]),
                                 x.shape[:2])
    return short_conv.conv_silu_norm(x, w, positions, D, NORMALIZE, SCALE, 1e-6, block_t,
                                     4, dpre_dtype)


def xla_form(x, w, segment_ids):
    """models.layers.conv_silu_norm's XLA path with convs holding w."""
    cfg = ModelConfig(conv_size=w.shape[0], d_model=C, num_heads=H)
    convs = [layers.ShortConv(cfg, C, rngs=nnx.Rngs(0)) for _ in range(w.shape[1])]
    for n, conv in enumerate(convs):
        conv.kernel[...] = w[:, n]
    outs, _ = layers.conv_silu_norm(convs, x, segment_ids=segment_ids, head_dim=D,
                                    normalize=NORMALIZE, scale=SCALE, impl="chunk")
    return outs


def inputs(b, t, taps, dtype=jnp.float32, seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (b, t, 3, C), jnp.float32).astype(dtype)
    w = jax.random.uniform(kw, (taps, 3, C), jnp.float32, -0.8, 0.8)
    return x, w


def packed(b, t):
    """Rows of several documents, boundaries at different places per row."""
    seg = np.zeros((b, t), np.int32)
    for bi in range(b):
        for cut in range(5 + 3 * bi, t, 11 + 4 * bi):
            seg[bi, cut:] += 1
    return jnp.asarray(seg)


CASES = [  # (batch, length, taps, packed, block_t)
    (2, 45, 4, False, 16),
    (2, 45, 4, True, 16),
    (1, 64, 3, True, 16),     # taps padded to 4
    (2, 37, 2, True, 32),     # one padded block
    (1, 80, 4, True, 32),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_float64_reference(case):
    b, t, taps, is_packed, block_t = case
    x, w = inputs(b, t, taps)
    seg = packed(b, t) if is_packed else None
    for got, want in zip(fused(x, w, seg, block_t), reference(x, w, seg)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_match_xla_form(case):
    b, t, taps, is_packed, block_t = case
    x, w = inputs(b, t, taps, seed=1)
    seg = packed(b, t) if is_packed else None
    cts = [jax.random.normal(jax.random.key(10 + n), (b, t, C)) for n in range(3)]

    def loss(fn):
        return lambda x, w: sum(jnp.sum(o * ct) for o, ct in zip(fn(x, w), cts))
    want = jax.grad(loss(lambda x, w: xla_form(x, w, seg)), (0, 1))(x, w)
    got = jax.grad(loss(lambda x, w: fused(x, w, seg, block_t)), (0, 1))(x, w)
    for g, r in zip(got, want):
        scale = float(jnp.max(jnp.abs(r)))
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-6 * scale,
                                   rtol=0)


def test_bf16_inputs_close_to_float32():
    """bf16 x: the kernel computes in float32 from the bf16 values, so against the
    float32 kernel on the same rounded inputs only the rounding of the outputs and of
    the cotangents (bf16 in, bf16 dx out) remains."""
    b, t = 2, 70
    x, w = inputs(b, t, 4, seed=2)
    xb = x.astype(jnp.bfloat16)
    seg = packed(b, t)
    for got, want in zip(fused(xb, w, seg, 32), fused(xb.astype(jnp.float32), w, seg, 32)):
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want),
                                   rtol=1e-2, atol=1e-2 * float(jnp.max(jnp.abs(want))))
    cts = [jax.random.normal(jax.random.key(20 + n), (b, t, C)) for n in range(3)]

    def grads(xx):
        def loss(xx, w):
            return sum(jnp.sum(o.astype(jnp.float32) * ct)
                       for o, ct in zip(fused(xx, w, seg, 32), cts))
        return jax.grad(loss, (0, 1))(xx, w)
    (dxb, dwb), (dx, dw) = grads(xb), grads(xb.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(dxb.astype(jnp.float32)), np.asarray(dx),
                               atol=1e-2 * float(jnp.max(jnp.abs(dx))), rtol=0)
    np.testing.assert_allclose(np.asarray(dwb), np.asarray(dw),
                               atol=1e-2 * float(jnp.max(jnp.abs(dw))), rtol=0)


def test_cotangent_stored_in_the_input_dtype():
    """dpre_dtype="input": the backward's stored cotangent in x's dtype. float32 x: the
    same gradients as the float32 store, exactly; bf16 x: within the cotangent's bf16
    rounding of the float32 store's gradients (on the same bf16 inputs and cotangents)."""
    b, t = 2, 70
    x, w = inputs(b, t, 4, seed=3)
    seg = packed(b, t)
    cts = [jax.random.normal(jax.random.key(30 + n), (b, t, C)) for n in range(3)]

    def grads(xx, dpre_dtype):
        def loss(xx, w):
            outs = fused(xx, w, seg, 16, dpre_dtype)
            return sum(jnp.sum(o * ct.astype(o.dtype)).astype(jnp.float32)
                       for o, ct in zip(outs, cts))
        return jax.grad(loss, (0, 1))(xx, w)
    for got, want in zip(grads(x, "input"), grads(x, "float32")):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    xb = x.astype(jnp.bfloat16)
    (dxb, dwb), (dx, dw) = grads(xb, "input"), grads(xb, "float32")
    assert dxb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(dxb.astype(jnp.float32)),
                               np.asarray(dx.astype(jnp.float32)),
                               atol=2e-2 * float(jnp.max(jnp.abs(dx.astype(jnp.float32)))),
                               rtol=0)
    np.testing.assert_allclose(np.asarray(dwb), np.asarray(dw),
                               atol=1e-2 * float(jnp.max(jnp.abs(dw))), rtol=0)
    with pytest.raises(ValueError, match="dpre_dtype"):
        fused(x, w, seg, 16, "bfloat16")


def test_dispatch():
    """The kernel runs with conv_impl="pallas" on a GPU only; a bad name is refused."""
    assert not ops.conv_silu_norm_fused("pallas", "auto", jnp.bfloat16, D, 4)  # CPU
    assert not ops.conv_silu_norm_fused("xla", "pallas", jnp.bfloat16, D, 4)
    with pytest.raises(ValueError, match="conv_impl"):
        ops.conv_silu_norm_fused("triton", "auto", jnp.bfloat16, D, 4)


def test_programs_lower_to_triton(monkeypatch):
    monkeypatch.setattr(common, "interpret", lambda: False)
    x, w = inputs(2, 256, 4, dtype=jnp.bfloat16)
    seg = packed(2, 256)

    def loss(x, w):
        return sum(jnp.sum(o.astype(jnp.float32)) for o in fused(x, w, seg, 32))
    text = jax.jit(jax.grad(loss, (0, 1))).trace(x, w).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "short_conv_fwd" in text and "short_conv_bwd" in text


def test_layers_share_one_lowering(monkeypatch):
    """kernels.ops.conv_silu_norm runs the kernel under one jax.jit, so a model's layers
    (same shapes and settings) share one lowering of its programs: the lowered module
    of three calls holds as many Triton programs as that of one."""
    monkeypatch.setattr(common, "interpret", lambda: False)
    x, w = inputs(2, 256, 4, dtype=jnp.bfloat16)
    positions = jnp.broadcast_to(layers.segment_positions(packed(2, 256), 256), (2, 256))

    def loss(calls):
        def fn(x, w):
            total = 0.0
            for _ in range(calls):
                outs = ops.conv_silu_norm(x, w, positions, head_dim=D, normalize=NORMALIZE,
                                          scale=SCALE)
                total = total + sum(jnp.sum(o.astype(jnp.float32)) for o in outs)
            return total
        return fn

    def programs(calls):
        # the loss and its gradient, as a train step takes them
        text = jax.jit(jax.value_and_grad(loss(calls), (0, 1))).trace(x, w).lower(
            lowering_platforms=("cuda",)).as_text()
        return text.count("__gpu$xla.gpu.triton")
    one = programs(1)
    assert one == 3 and programs(3) == one  # the forward and the backward's two
