"""Delta-rule mixers (kernels.ops.gated_delta_rule): `gated_deltanet` and `deltanet`.

Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025; fla's `GatedDeltaNet` layer):
  q, k, v = silu(short_conv(proj(x)))            depthwise causal conv, size cfg.conv_size
  q, k    = l2norm(q), l2norm(k); q *= 1/sqrt(K)
  beta    = sigmoid(b_proj(x))
  log a   = -exp(A_log) * softplus(a_proj(x) + dt_bias)     (decay in (0, 1))
  S_t     = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
  y       = o_proj(rmsnorm(o) * scale * silu(g_proj(x)))
DeltaNet (Schlag et al. 2021; Yang et al. 2024; fla's `DeltaNet`) is the same with no
decay (log a = 0) and a plain RMSNorm on the output, no gate.
Decode state: S (B, H, K, V) float32 plus the last conv_size-1 inputs of each conv.
Here K = V = head_dim (fla's layer widens v by expand_v=2 by default; keeping them equal
makes the state H * d * d, comparable with the other mixers at the same width).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import context_parallel
from models.config import ModelConfig
from models.layers import (GatedRMSNorm, ShortConv, conv_silu_norm, dense, dtypes, meta,
                           stacked_dense, unstack)
from models.mixers.recurrent import RecurrentMixer
from models.mixers.registry import DELTANET, GATED_DELTANET, register


class _DeltaRule(RecurrentMixer):
    gated = False

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg)
        h, d = self.num_heads, self.head_dim
        qkv = {"use_bias": cfg.qkv_bias}  # biases as an imported teacher's (cfg.qkv_bias)
        self.q_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.k_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.v_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.b_proj = dense(cfg, cfg.d_model, h, ("embed", "heads"), rngs=rngs)
        self.q_conv = ShortConv(cfg, h * d, rngs=rngs)
        self.k_conv = ShortConv(cfg, h * d, rngs=rngs)
        self.v_conv = ShortConv(cfg, h * d, rngs=rngs)
        self.o_proj = dense(cfg, h * d, cfg.d_model, ("heads", "embed"), rngs=rngs,
                            use_bias=cfg.o_bias)

    def _head_projections(self):
        """The projections of width H taken from x: beta's (and the decay's, gated)."""
        return [self.b_proj]

    def _gate(self, x):
        """The output gate's projection of x (B, T, H * K), or None without a gate."""
        return None

    def _log_alpha(self, heads):
        """log a (B, T, H) float32 from the _head_projections' outputs (each (B, T, H))."""
        return None

    def _inputs(self, x, *, segment_ids, conv_state):
        b, t, _ = x.shape
        h, d = self.num_heads, self.head_dim
        convs = (self.q_conv, self.k_conv, self.v_conv)
        # q, k, v through one matmul and one conv (stacked_dense / conv_silu_norm): the
        # same values as one of each per input, with a fraction of the small ops (most of
        # a small model's step on the CPU; docs/benchmarks.md). The output gate's
        # projection is its own matmul: stacked with q, k, v, its cotangent and the conv's
        # would be copied into one (B, T, 4, C) array for x's gradient; apart, the two
        # matmuls' cotangents of x just add.
        qkv = stacked_dense([self.q_proj, self.k_proj, self.v_proj], x)
        gate = self._gate(x)
        state = (None if conv_state is None
                 else jnp.stack([conv_state[n] for n in "qkv"], axis=2))
        # training (no conv state): on a GPU one fused kernel (model.conv_impl)
        (q, k, v), state = conv_silu_norm(
            convs, qkv, segment_ids=segment_ids, head_dim=d, normalize=(True, True, False),
            scale=(1.0 / math.sqrt(d), 1.0, 1.0), impl=self.cfg.impl,
            conv_impl=self.cfg.conv_impl, state=state)
        q, k, v = (part.reshape(b, t, h, d) for part in (q, k, v))
        new_conv_state = None if conv_state is None else dict(zip("qkv", unstack(state, 2)))
        heads = unstack(stacked_dense(self._head_projections(), x).astype(jnp.float32), 2)
        beta = jax.nn.sigmoid(heads[0])
        log_alpha = self._log_alpha(heads)
        if log_alpha is None:
            log_alpha = jnp.zeros_like(beta)
        inputs = {"q": q.astype(v.dtype), "k": k, "v": v, "log_alpha": log_alpha, "beta": beta,
                  "gate": gate}
        return inputs, new_conv_state

    def _op(self, inputs, *, segment_ids, initial_state, return_state, impl):
        return context_parallel.gated_delta_rule(
            inputs["q"], inputs["k"], inputs["v"], inputs["log_alpha"], inputs["beta"],
            segment_ids=segment_ids, initial_state=initial_state, return_state=return_state,
            impl=impl, chunk_size=self.cfg.chunk_size)

    def _conv_state(self, batch: int):
        c = self.num_heads * self.head_dim
        dtype = dtypes(self.cfg)[0]
        return {name: conv.init_state(batch, c, dtype)
                for name, conv in (("q", self.q_conv), ("k", self.k_conv), ("v", self.v_conv))}


@register(GATED_DELTANET)
class GatedDeltaNet(_DeltaRule):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        h, d = self.num_heads, self.head_dim
        _, param_dtype = dtypes(cfg)
        self.a_proj = dense(cfg, cfg.d_model, h, ("embed", "heads"), rngs=rngs)
        self.g_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs)
        # Mamba-2 / fla init: A ~ U(1, 16); dt ~ logU(1e-3, 1e-1), dt_bias = softplus^-1(dt).
        a_key, dt_key = jax.random.split(rngs.params())
        a = jax.random.uniform(a_key, (h,), jnp.float32, 1.0, 16.0)
        self.A_log = nnx.Param(jnp.log(a).astype(param_dtype), **meta("heads"))
        dt = jnp.exp(jax.random.uniform(dt_key, (h,), jnp.float32,
                                        math.log(1e-3), math.log(1e-1)))
        dt = jnp.maximum(dt, 1e-4)
        self.dt_bias = nnx.Param((dt + jnp.log(-jnp.expm1(-dt))).astype(param_dtype),
                                 **meta("heads"))
        self.o_norm = GatedRMSNorm(cfg, d)

    def _head_projections(self):
        return [self.b_proj, self.a_proj]

    def _gate(self, x):
        return self.g_proj(x)

    def _log_alpha(self, heads):
        a = heads[1] + self.dt_bias[...].astype(jnp.float32)
        return -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)

    def _output(self, o, x, inputs):
        b, t, h, d = o.shape
        g = inputs["gate"].reshape(b, t, h, d)
        return self.o_proj(self.o_norm(o, g).reshape(b, t, h * d))


@register(DELTANET)
class DeltaNet(_DeltaRule):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        dtype, param_dtype = dtypes(cfg)
        self.o_norm = nnx.RMSNorm(self.head_dim, epsilon=cfg.norm_eps, dtype=dtype,
                                  param_dtype=param_dtype, scale_metadata=meta("norm"),
                                  rngs=rngs)

    def _output(self, o, x, inputs):
        b, t, h, d = o.shape
        return self.o_proj(self.o_norm(o).reshape(b, t, h * d))
