"""Lightning attention (MiniMax-01, 2025; TransNormerLLM before it).

  q, k, v = silu(qkv_proj(x))
  S_t     = exp(-slope_h) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t     (no denominator)
  y       = out_proj(sigmoid(output_gate(x)) * rmsnorm(o))

slope_h are ALiBi's head slopes, a fixed geometric sequence, so heads remember over
different horizons. (MiniMax also shrinks them with depth; a mixer does not know its
layer index here, so every layer uses the base slopes.)

cfg.short_conv puts fla's ShortConvolution (causal depthwise conv of conv_size taps, no
bias, then SiLU) between qkv_proj and the SiLU: q, k, v = silu(conv(qkv_proj(x))), one
depthwise conv over the 3 H D channels (the same as a conv each for q, k and v). Neither
MiniMax's layer nor fla's LightNet (use_short_conv=False) has one by default.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import context_parallel
from models.config import ModelConfig
from models.layers import ShortConv, dense, dtypes, rms_norm, unstack
from models.mixers.recurrent import RecurrentMixer
from models.mixers.registry import LIGHTNING, register


def alibi_slopes(n: int) -> list[float]:
    """ALiBi slopes (Press et al. 2022): 2^(-8/n), its powers; interleaved for n != 2^k."""
    def power_of_two(m):
        start = 2.0 ** (-8.0 / m)
        return [start ** (i + 1) for i in range(m)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


@register(LIGHTNING)
class LightningAttention(RecurrentMixer):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg)
        h, d = self.num_heads, self.head_dim
        self.qkv_proj = dense(cfg, cfg.d_model, 3 * h * d, ("embed", "heads"), rngs=rngs,
                              use_bias=cfg.qkv_bias)
        self.output_gate = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs)
        self.norm = rms_norm(cfg, h * d, rngs=rngs)
        self.out_proj = dense(cfg, h * d, cfg.d_model, ("heads", "embed"), rngs=rngs,
                              use_bias=cfg.o_bias)
        self.slopes = tuple(alibi_slopes(h))  # static: fixed, not trained
        # Built only when asked for: a model without it keeps its parameters as before.
        self.qkv_conv = ShortConv(cfg, 3 * h * d, rngs=rngs) if cfg.short_conv else None

    def _inputs(self, x, *, segment_ids, conv_state):
        b, t, _ = x.shape
        h, d = self.num_heads, self.head_dim
        qkv, new_conv = self.qkv_proj(x), None
        if self.qkv_conv is None:
            qkv = jax.nn.silu(qkv)
        else:  # ShortConv ends with the SiLU
            qkv, conv = self.qkv_conv(qkv, segment_ids=segment_ids,
                                      state=(conv_state or {}).get("qkv"))
            new_conv = {"qkv": conv}
        # a split (layers.unstack), not qkv[:, :, i]: the indexing's gradient is three
        # zero-padded copies summed, which XLA's CPU fuses into the projection's weight
        # gradient as one slow transposing loop (docs/benchmarks.md, session 30)
        q, k, v = unstack(qkv.reshape(b, t, 3, h, d), 2)
        return {"q": q, "k": k, "v": v}, new_conv

    def _conv_state(self, batch: int):
        if self.qkv_conv is None:
            return None
        c = 3 * self.num_heads * self.head_dim
        return {"qkv": self.qkv_conv.init_state(batch, c, dtypes(self.cfg)[0])}

    def _op(self, inputs, *, segment_ids, initial_state, return_state, impl):
        log_decay = -jnp.asarray(self.slopes, jnp.float32)
        return context_parallel.linear_attention(
            inputs["q"], inputs["k"], inputs["v"], normalize=False, log_decay=log_decay,
            segment_ids=segment_ids, initial_state=initial_state, return_state=return_state,
            impl=impl, chunk_size=self.cfg.chunk_size)

    def _output(self, o, x, inputs):
        b, t = o.shape[:2]
        o = self.norm(o.reshape(b, t, -1))
        return self.out_proj(jax.nn.sigmoid(self.output_gate(x)) * o)
