"""Small building blocks shared by the mixers and the LanguageModel.

Every parameter carries logical axis names ("embed", "vocab", "mlp", "heads", "kv",
"norm", None) as `sharding_names` metadata; training maps them to mesh axes. They are
created with eager_sharding=False so a model builds with no mesh (tests, CPU) and gets
placed later by the training code's shardings.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels import context_parallel, ops
from models.config import ModelConfig


class Buffer(nnx.Variable):
    """A non-trainable array stored with the model (e.g. Performer's fixed omega)."""


def dtypes(cfg: ModelConfig):
    """(compute dtype, parameter dtype) of a config."""
    return jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)


def meta(*names):
    return {"sharding_names": tuple(names), "eager_sharding": False}


def dense(cfg: ModelConfig, d_in: int, d_out: int, axes: tuple, *, rngs: nnx.Rngs,
          use_bias: bool = False, kernel_init=None) -> nnx.Linear:
    """nnx.Linear in the compute dtype with float32 (param_dtype) weights and axis names."""
    dtype, param_dtype = dtypes(cfg)
    kwargs = {} if kernel_init is None else {"kernel_init": kernel_init}
    return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                      kernel_metadata=meta(*axes), bias_metadata=meta(axes[-1]),
                      rngs=rngs, **kwargs)


def rms_norm(cfg: ModelConfig, dim: int, *, rngs: nnx.Rngs) -> nnx.RMSNorm:
    dtype, param_dtype = dtypes(cfg)
    return nnx.RMSNorm(dim, epsilon=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype,
                       scale_metadata=meta("norm"), rngs=rngs)


def block_norm(cfg: ModelConfig, dim: int, *, rngs: nnx.Rngs):
    """The blocks' and the final norm, by cfg.norm: RMSNorm, or LayerNorm with a bias
    (GPT-2's; the two-pass variance, as torch computes it)."""
    if cfg.norm == "rmsnorm":
        return rms_norm(cfg, dim, rngs=rngs)
    dtype, param_dtype = dtypes(cfg)
    return nnx.LayerNorm(dim, epsilon=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype,
                         use_fast_variance=False, scale_metadata=meta("norm"),
                         bias_metadata=meta("norm"), rngs=rngs)


class GatedRMSNorm(nnx.Module):
    """RMSNorm over the last axis times silu(gate) (Gated DeltaNet's output norm, fla's
    FusedRMSNormGated): y = x / rms(x) * scale * silu(g)."""

    def __init__(self, cfg: ModelConfig, dim: int):
        _, param_dtype = dtypes(cfg)
        self.eps = cfg.norm_eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), **meta("norm"))

    def __call__(self, x, gate):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        y = y * self.scale[...].astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))
        return y.astype(x.dtype)


def l2_normalize(x, eps: float = 1e-6):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


# --- Positions ------------------------------------------------------------------------

def segment_positions(segment_ids, seq_len: int):
    """Position of each token inside its own segment, (B, T) int32.

    With segment_ids None every row counts 0..T-1. Packed documents restart at 0, so a
    document gets the same rotary angles packed or alone.
    """
    t = jnp.arange(seq_len, dtype=jnp.int32)
    if segment_ids is None:
        return t[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], dtype=bool),
         segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start_index = jax.lax.cummax(jnp.where(starts, t[None, :], 0), axis=1)
    return t[None, :] - start_index


def rope_frequencies(cfg: ModelConfig, dim: int) -> np.ndarray:
    """The D/2 rotary frequencies (float32) of cfg: theta^(-2i/D), scaled as
    cfg.rope_scaling says (Hugging Face's _compute_default / linear / llama3 rope
    parameters, computed as they do, in float32)."""
    if dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {dim}")
    freqs = (1.0 / (np.float32(cfg.rope_theta)
                    ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))))
    freqs = freqs.astype(np.float32)
    factor = np.float32(cfg.rope_factor)
    if cfg.rope_scaling == "linear":
        freqs = freqs / factor
    elif cfg.rope_scaling == "llama3":
        old = np.float32(cfg.rope_original_max_len)
        low, high = np.float32(cfg.rope_low_freq_factor), np.float32(cfg.rope_high_freq_factor)
        wavelen = np.float32(2 * math.pi) / freqs
        scaled = np.where(wavelen > old / low, freqs / factor, freqs)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        freqs = np.where(medium, smoothed, scaled)
    return freqs.astype(np.float32)


def rope(x, positions, theta: float = 10000.0, *, freqs=None):
    """Rotary embedding (half-split form) of x (B, T, H, D) at positions (B|1, T);
    freqs (D/2,) the frequencies (rope_frequencies), default theta^(-2i/D)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {d}")
    if freqs is None:
        freqs = theta ** (-jnp.arange(0, d // 2, dtype=jnp.float32) * 2.0 / d)
    freqs = jnp.asarray(freqs, jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # (B, T, D/2)
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rotary(cfg: ModelConfig, x, positions):
    """x (B, T, H, D) rotated as cfg says: RoPE (cfg.rope_theta, cfg.rope_scaling) when
    cfg.positions is "rope", else x unchanged (learned or no positions)."""
    if cfg.positions != "rope":
        return x
    if cfg.rope_scaling == "none":  # the formula models were trained with before scaling
        return rope(x, positions, cfg.rope_theta)
    return rope(x, positions, freqs=rope_frequencies(cfg, x.shape[-1]))


# --- Short causal convolution ----------------------------------------------------------

class ShortConv(nnx.Module):
    """Depthwise causal conv over time followed by SiLU (fla's ShortConvolution).

    y_t = silu(b + sum_i w_i x_{t-(c-1)+i}). Taps reaching into another segment are
    masked, so packed documents never see each other. Decode state: the last c-1 inputs.
    size defaults to cfg.conv_size; bias (fla's conv_bias, off by default) and the SiLU
    (activation=False: the plain conv, Zoology's ShortConvolution) are options.
    """

    def __init__(self, cfg: ModelConfig, channels: int, *, rngs: nnx.Rngs, size: int = 0,
                 bias: bool = False, activation: bool = True):
        _, param_dtype = dtypes(cfg)
        self.size = size = size or cfg.conv_size
        self.activation = activation
        bound = 1.0 / math.sqrt(size)  # torch Conv1d default, fan_in = c
        w = jax.random.uniform(rngs.params(), (size, channels), param_dtype, -bound, bound)
        self.kernel = nnx.Param(w, **meta(None, "heads"))
        self.bias = (nnx.Param(jax.random.uniform(rngs.params(), (channels,), param_dtype,
                                                  -bound, bound), **meta("heads"))
                     if bias else None)

    def init_state(self, batch: int, channels: int, dtype):
        return jnp.zeros((batch, self.size - 1, channels), dtype)

    def __call__(self, x, *, segment_ids=None, state=None):
        """x (B, T, C) -> (y (B, T, C), new state (B, c-1, C)). Split along time when a
        `sequence` mesh is active (kernels.context_parallel.short_conv: each device gets
        the previous one's last c-1 inputs)."""
        bias = None if self.bias is None else self.bias[...]
        return _causal_conv(x, segment_ids, state, self.kernel[...], bias, self.activation)


def _causal_conv(x, segment_ids, state, kernel, bias, activation: bool):
    """x (B, T, *C) through the causal conv of kernel (c, *C), from state (B, c-1, *C) or
    zeros; returns (y, the last c-1 inputs)."""
    if state is None:
        state = jnp.zeros((x.shape[0], kernel.shape[0] - 1) + x.shape[2:], x.dtype)
    return context_parallel.short_conv(
        lambda xp, segp: _conv_taps(xp, segp, kernel, bias, activation),
        x, segment_ids, state)


def _conv_taps(xp, segp, kernel, bias, activation: bool):
    """The conv of xp's last T positions, xp (B, c-1+T, *C) holding the c-1 inputs before
    them first; segp (B, c-1+T) their segment ids (-1 for a state) or None; kernel
    (c, *C), bias (*C) or None."""
    c = kernel.shape[0]
    t = xp.shape[1] - (c - 1)
    # keep[i] (B, T): tap i (reading x_{t - (c-1-i)}) lies in the query's segment; the
    # last tap reads the query's own input, always kept, so keep holds the first c-1
    keep = (None if segp is None or c == 1 else
            jnp.stack([segp[:, i:i + t] == segp[:, c - 1:] for i in range(c - 1)]))
    return _conv_taps_fn(activation, xp, keep, kernel, bias)


def _tap_keep(keep, i: int, rows: slice = slice(None)):
    """Tap i's keep mask at `rows` of the time axis, (B, rows), from keep (c-1, B, T), or
    None (every row kept): no masks at all, or the last tap (the query's own input)."""
    return None if keep is None or i >= keep.shape[0] else keep[i, :, rows]


def _summed_to_type_of(cotangent, primal):
    """The cotangent summed over the manual mesh axes (inside shard_map: the sequence-split
    conv) it varies over and its primal does not, as autodiff does for a weight that every
    device applies to its own part of the sequence."""
    extra = tuple(sorted(_varying_axes(cotangent) - _varying_axes(primal)))
    return jax.lax.psum(cotangent, extra) if extra else cotangent


def _varying_axes(x) -> frozenset:
    """The manual mesh axes x's type varies over (jax 0.10+: manual_axis_type; before:
    vma)."""
    aval = jax.typeof(x)
    axis_type = getattr(aval, "manual_axis_type", None)
    if axis_type is not None:
        return frozenset(axis_type.varying)
    return frozenset(getattr(aval, "vma", ()))


def _rows_where(mask, x):
    """x where mask (x's first two axes) holds, else 0; x itself when mask is None."""
    if mask is None:
        return x
    return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, 0)


def _conv_pre(xp, keep, kernel, bias):
    """sum_i keep_i x_{t-(c-1-i)} w_i (+ b) in float32 (fla's causal_conv1d accumulates in
    float32 too: a bfloat16 sum of the taps rounds at every add, and the weights' gradient
    would be reduced over B x T in bfloat16)."""
    c = kernel.shape[0]
    t = xp.shape[1] - (c - 1)
    w = kernel.astype(jnp.float32)
    y = sum(_rows_where(_tap_keep(keep, i), xp[:, i:i + t].astype(jnp.float32)) * w[i]
            for i in range(c))
    return y if bias is None else y + bias.astype(jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv_taps_fn(activation: bool, xp, keep, kernel, bias):
    """The conv (silu(_conv_pre) when activation) in xp's dtype; keep (c-1, B, T) bool
    (the first c-1 taps' masks) or None (every tap kept)."""
    y = _conv_pre(xp, keep, kernel, bias)
    return (jax.nn.silu(y) if activation else y).astype(xp.dtype)


def _conv_taps_fwd(activation, xp, keep, kernel, bias):
    return _conv_taps_fn(activation, xp, keep, kernel, bias), (xp, keep, kernel, bias)


def _conv_taps_bwd(activation, res, dy):
    """The input's gradient as c shifted slices of one zero-padded copy of the output's
    gradient, which XLA fuses into one pass. Autodiff of the taps' slices gives c
    zero-padded copies summed instead, and XLA's CPU fuses those into the projection's
    weight-gradient transpose as a slow loop (docs/benchmarks.md, session 30)."""
    xp, keep, kernel, bias = res
    c = kernel.shape[0]
    t = xp.shape[1] - (c - 1)
    g = dy.astype(jnp.float32)
    if activation:  # silu'(x) = s (1 + x (1 - s)), s = sigmoid(x); x recomputed
        pre = _conv_pre(xp, keep, kernel, bias)
        sig = jax.nn.sigmoid(pre)
        g = g * sig * (1 + pre * (1 - sig))
    d_kernel = jnp.stack([
        jnp.sum(g * _rows_where(_tap_keep(keep, i), xp[:, i:i + t].astype(jnp.float32)),
                axis=(0, 1))
        for i in range(c)])
    d_bias = None if bias is None else jnp.sum(g, axis=(0, 1)).astype(bias.dtype)
    # input j feeds output j - i through tap i, so d_xp[j] = sum_i w_i keep_i g at j - i:
    # rows [c-1-i, c-1-i + T+c-1) of g and keep padded by c-1 zeros on both sides
    span = t + c - 1
    g = jnp.pad(g, [(0, 0), (c - 1, c - 1)] + [(0, 0)] * (g.ndim - 2))
    if keep is not None:
        keep = jnp.pad(keep, [(0, 0), (0, 0), (c - 1, c - 1)])
    w = kernel.astype(jnp.float32)
    rows = [slice(c - 1 - i, c - 1 - i + span) for i in range(c)]
    d_xp = sum(_rows_where(_tap_keep(keep, i, rows[i]), g[:, rows[i]]) * w[i]
               for i in range(c))
    d_kernel = _summed_to_type_of(d_kernel.astype(kernel.dtype), kernel)
    d_bias = None if bias is None else _summed_to_type_of(d_bias, bias)
    return _summed_to_type_of(d_xp.astype(xp.dtype), xp), None, d_kernel, d_bias


_conv_taps_fn.defvjp(_conv_taps_fwd, _conv_taps_bwd)


def stacked_short_conv(convs, x, *, segment_ids=None, state=None):
    """[conv(x[:, :, n]) for n, conv in enumerate(convs)] as one conv: x (B, T, N, C), the
    N convs of equal size and width (same bias and activation settings); state (B, c-1,
    N, C) or None. Returns (y (B, T, N, C), new state (B, c-1, N, C)). One set of fused
    loops instead of N (the convs' elementwise work is a large share of a small model's
    step); the stacking axis is new, so a channel axis sharded over `tensor` stays so."""
    first = convs[0]
    kernel = jnp.stack([conv.kernel[...] for conv in convs], axis=1)  # (c, N, C)
    bias = (None if first.bias is None
            else jnp.stack([conv.bias[...] for conv in convs]))
    return _causal_conv(x, segment_ids, state, kernel, bias, first.activation)


def conv_silu_norm(convs, x, *, segment_ids, head_dim: int, normalize, scale, impl: str,
                   conv_impl: str = "xla", state=None):
    """The stacked convs (stacked_short_conv: SiLU on, no bias) then, per input n, L2
    normalisation over each head of head_dim where normalize[n] and a factor scale[n]:
    (the N outputs (B, T, C), the new conv state (B, c-1, N, C)). conv_impl "pallas" with
    no state in (training): one Pallas kernel each way on a GPU
    (kernels.ops.conv_silu_norm_fused says where), without a sequence mesh (the kernel
    reads no other device's rows), returning no state; elsewhere these XLA ops."""
    taps = convs[0].size
    if (state is None and context_parallel.active_mesh() is None
            and convs[0].bias is None and convs[0].activation
            and ops.conv_silu_norm_fused(conv_impl, impl, x.dtype, head_dim, taps)):
        positions = jnp.broadcast_to(segment_positions(segment_ids, x.shape[1]),
                                     x.shape[:2])
        kernel = jnp.stack([conv.kernel[...] for conv in convs], axis=1)
        return ops.conv_silu_norm(x, kernel, positions, head_dim=head_dim,
                                  normalize=normalize, scale=scale), None
    y, state = stacked_short_conv(convs, x, segment_ids=segment_ids, state=state)
    outs = []
    for part, norm, factor in zip(unstack(y, 2), normalize, scale):
        heads = part.reshape(part.shape[:2] + (-1, head_dim))
        if norm:
            heads = l2_normalize(heads)
        if factor != 1.0:
            heads = heads * factor
        outs.append(heads.reshape(part.shape))
    return outs, state


def unstack(x, axis: int):
    """The slices of x along `axis`, by a split: its gradient is one concatenation, where
    indexing each slice out would make it a sum of zero-padded copies (every slice's work
    at every element)."""
    return [jnp.squeeze(part, axis) for part in jnp.split(x, x.shape[axis], axis=axis)]


def stacked_dense(layers, x):
    """[layer(x) for layer in layers] (nnx.Linear of equal shapes and dtypes, with or
    without biases) as one matmul, stacked on a new axis before the output one:
    (..., N, d_out). Fewer, larger matmuls (the gradient's too); a new axis, so an
    output axis sharded over `tensor` stays so (concatenating along it would not)."""
    first = layers[0]
    kernel = jnp.stack([layer.kernel[...] for layer in layers], axis=1)  # (d_in, N, d_out)
    x, kernel = nnx.nn.dtypes.promote_dtype((x, kernel), dtype=first.dtype)
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                            precision=first.precision)
    if any(layer.bias is not None for layer in layers):  # a layer without one adds 0
        bias = jnp.stack([jnp.zeros(layer.out_features, kernel.dtype)
                          if layer.bias is None else layer.bias[...] for layer in layers])
        y = y + bias.astype(y.dtype)
    return y


# --- MLP ------------------------------------------------------------------------------

class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)) (biases with cfg.mlp_bias)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, bias = cfg.d_model, cfg.resolved_d_ff, cfg.mlp_bias
        self.gate = dense(cfg, d, f, ("embed", "mlp"), rngs=rngs, use_bias=bias)
        self.up = dense(cfg, d, f, ("embed", "mlp"), rngs=rngs, use_bias=bias)
        self.down = dense(cfg, f, d, ("mlp", "embed"), rngs=rngs, use_bias=bias)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class GeluMLP(nnx.Module):
    """down(gelu(up(x))) (GPT-2's c_fc, gelu_new, c_proj): cfg.mlp_type "gelu" (erf) or
    "gelu_tanh" (the tanh approximation); biases with cfg.mlp_bias."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, bias = cfg.d_model, cfg.resolved_d_ff, cfg.mlp_bias
        self.approximate = cfg.mlp_type == "gelu_tanh"
        self.up = dense(cfg, d, f, ("embed", "mlp"), rngs=rngs, use_bias=bias)
        self.down = dense(cfg, f, d, ("mlp", "embed"), rngs=rngs, use_bias=bias)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x), approximate=self.approximate))


def make_mlp(cfg: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    return SwiGLU(cfg, rngs=rngs) if cfg.mlp_type == "swiglu" else GeluMLP(cfg, rngs=rngs)
