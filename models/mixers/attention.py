"""Softmax attention mixers: full causal (KV cache) and sliding window (ring buffer).

Both are multi-head / grouped-query with RoPE (cfg.positions "rope", scaled by
cfg.rope_scaling; none with "learned" or "none" positions), biases by cfg.qkv_bias and
cfg.o_bias. Full sequences go through
kernels.ops.softmax_attention / sliding_window_attention, a decode step through
kernels.ops.attend_to_cache (same 1/sqrt(D) scale, float32 softmax).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import context_parallel, ops
from models.config import ModelConfig
from models.layers import dense, rotary, segment_positions
from models.mixers.base import Mixer
from models.mixers.registry import SLIDING_WINDOW, SOFTMAX, register


class _Attention(Mixer):
    """Projections and RoPE shared by the softmax mixers."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.num_heads, self.kv_heads = cfg.num_heads, cfg.resolved_kv_heads
        self.head_dim = d = cfg.resolved_head_dim
        qkv, o = {"use_bias": cfg.qkv_bias}, {"use_bias": cfg.o_bias}
        self.q_proj = dense(cfg, cfg.d_model, self.num_heads * d, ("embed", "heads"),
                            rngs=rngs, **qkv)
        self.k_proj = dense(cfg, cfg.d_model, self.kv_heads * d, ("embed", "heads"),
                            rngs=rngs, **qkv)
        self.v_proj = dense(cfg, cfg.d_model, self.kv_heads * d, ("embed", "heads"),
                            rngs=rngs, **qkv)
        self.o_proj = dense(cfg, self.num_heads * d, cfg.d_model, ("heads", "embed"),
                            rngs=rngs, **o)
        # Dropout on the attention probabilities; only built when asked for, so models
        # without it keep the same state (and checkpoints) as before.
        self.attn_dropout = (nnx.Dropout(cfg.attention_dropout, rngs=rngs)
                             if cfg.attention_dropout > 0 else None)

    takes_deterministic = True  # Block passes `deterministic` (training vs evaluation)

    @classmethod
    def _keys_per_query(cls, cfg: ModelConfig, seq_len: int) -> int:
        """How many keys a query is counted against at context seq_len."""
        raise NotImplementedError

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """2 D per key for the score and 2 D for the weighted value, per query head, over
        every key in reach as if non-causal (nanoGPT's 12 L d T = 3 x 4 L d T)."""
        keys = cls._keys_per_query(cfg, seq_len)
        return 4.0 * keys * cfg.num_heads * cfg.resolved_head_dim

    def _dropout_args(self, deterministic: bool) -> dict:
        if self.attn_dropout is None or deterministic:
            return {}
        return {"dropout_rate": self.attn_dropout.rate, "dropout_rng": self.attn_dropout.rngs()}

    def _qkv(self, x, positions):
        b, t, _ = x.shape
        d = self.head_dim
        q = self.q_proj(x).reshape(b, t, self.num_heads, d)
        k = self.k_proj(x).reshape(b, t, self.kv_heads, d)
        v = self.v_proj(x).reshape(b, t, self.kv_heads, d)
        return rotary(self.cfg, q, positions), rotary(self.cfg, k, positions), v

    def _out(self, o):
        b, t = o.shape[:2]
        return self.o_proj(o.reshape(b, t, self.num_heads * self.head_dim))

    @staticmethod
    def _check_fresh(state):
        """prefill runs a prompt from position 0 (RoPE angles and cache slots start there)."""
        pos = state["pos"]
        if not isinstance(pos, jax.core.Tracer) and int(pos) != 0:
            raise ValueError(f"prefill needs a fresh cache (at position {int(pos)}); continue "
                             f"a started sequence with step/decode_step")

    def _cache(self, batch: int, length: int):
        dtype = jnp.dtype(self.cfg.dtype)
        shape = (batch, length, self.kv_heads, self.head_dim)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
                "pos": jnp.zeros((), jnp.int32)}


@register(SOFTMAX)
class SoftmaxAttention(_Attention):
    """Causal multi-head / grouped-query softmax attention with RoPE; decodes with a KV
    cache of max_len tokens."""

    state_grows = True  # state_size() is per cached token

    @classmethod
    def _keys_per_query(cls, cfg: ModelConfig, seq_len: int) -> int:
        return seq_len

    def __call__(self, x, *, segment_ids=None, deterministic: bool = True):
        q, k, v = self._qkv(x, segment_positions(segment_ids, x.shape[1]))
        return self._out(context_parallel.softmax_attention(
            q, k, v, segment_ids=segment_ids, causal=True,
            mask_every_head=self.cfg.mask_every_head,
            max_segments=self.cfg.attention_max_segments,
            **self._dropout_args(deterministic)))

    def init_state(self, batch: int, max_len: int):
        return self._cache(batch, max_len)

    def prefill(self, x, state):
        self._check_fresh(state)
        t = x.shape[1]
        if t > state["k"].shape[1]:
            raise ValueError(f"prefill of {t} tokens does not fit a KV cache of "
                             f"{state['k'].shape[1]}; pass a larger max_len to init_state")
        q, k, v = self._qkv(x, segment_positions(None, t))
        y = self._out(ops.softmax_attention(q, k, v, causal=True))
        state = {"k": state["k"].at[:, :t].set(k.astype(state["k"].dtype)),
                 "v": state["v"].at[:, :t].set(v.astype(state["v"].dtype)),
                 "pos": jnp.asarray(t, jnp.int32)}
        return y, state

    def step(self, x_t, state):
        """One token at position state["pos"], which must stay below the cache length (checked
        when pos is concrete; under jit a full cache would silently overwrite its last slot)."""
        pos = state["pos"]
        if not isinstance(pos, jax.core.Tracer) and int(pos) >= state["k"].shape[1]:
            raise ValueError(f"KV cache full: position {int(pos)} of a cache of "
                             f"{state['k'].shape[1]}; pass a larger max_len to init_cache")
        q, k, v = self._qkv(x_t[:, None], jnp.full((1, 1), pos, jnp.int32))
        kc = jax.lax.dynamic_update_slice_in_dim(state["k"], k.astype(state["k"].dtype), pos, 1)
        vc = jax.lax.dynamic_update_slice_in_dim(state["v"], v.astype(state["v"].dtype), pos, 1)
        o = ops.attend_to_cache(q[:, 0], kc, vc, pos + 1)  # slots [0, pos] are filled
        return self._out(o[:, None])[:, 0], {"k": kc, "v": vc, "pos": pos + 1}

    def state_size(self) -> int:
        return 2 * self.kv_heads * self.head_dim


@register(SLIDING_WINDOW)
class SlidingWindowAttention(_Attention):
    """Causal softmax attention over the last `window` tokens (self included), RoPE;
    decodes with a ring buffer of `window` keys and values."""

    @classmethod
    def _keys_per_query(cls, cfg: ModelConfig, seq_len: int) -> int:
        return min(seq_len, cfg.window)

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.window = cfg.window

    def __call__(self, x, *, segment_ids=None, deterministic: bool = True):
        q, k, v = self._qkv(x, segment_positions(segment_ids, x.shape[1]))
        drop = self._dropout_args(deterministic)
        if drop:  # the explicit (T x T) path: the banded kernel has no dropout
            o = ops.softmax_attention(q, k, v, segment_ids=segment_ids, causal=True,
                                      window=self.window, **drop)
        else:  # split along time under a `sequence` mesh (kernels.context_parallel)
            o = context_parallel.sliding_window_attention(q, k, v, window=self.window,
                                                          segment_ids=segment_ids,
                                                          impl=self.cfg.window_impl,
                                                          mask_every_head=self.cfg.mask_every_head)
        return self._out(o)

    def init_state(self, batch: int, max_len: int):
        return self._cache(batch, self.window)  # never more than the window

    def prefill(self, x, state):
        self._check_fresh(state)
        t, w = x.shape[1], self.window
        q, k, v = self._qkv(x, segment_positions(None, t))
        y = self._out(ops.sliding_window_attention(q, k, v, window=w))
        keep = jnp.arange(max(0, t - w), t)  # the last w positions go to slots pos % w
        state = {"k": state["k"].at[:, keep % w].set(k[:, keep].astype(state["k"].dtype)),
                 "v": state["v"].at[:, keep % w].set(v[:, keep].astype(state["v"].dtype)),
                 "pos": jnp.asarray(t, jnp.int32)}
        return y, state

    def step(self, x_t, state):
        pos, w = state["pos"], self.window
        q, k, v = self._qkv(x_t[:, None], jnp.full((1, 1), pos, jnp.int32))
        slot = pos % w
        kc = jax.lax.dynamic_update_slice_in_dim(state["k"], k.astype(state["k"].dtype), slot, 1)
        vc = jax.lax.dynamic_update_slice_in_dim(state["v"], v.astype(state["v"].dtype), slot, 1)
        # The buffer holds exactly the last min(pos+1, w) tokens; softmax ignores slot order.
        valid = ops.ring_buffer_mask(jnp.full((x_t.shape[0],), pos + 1), w)
        o = ops.attend_to_cache(q[:, 0], kc, vc, valid)
        return self._out(o[:, None])[:, 0], {"k": kc, "v": vc, "pos": pos + 1}

    def state_size(self) -> int:
        return self.window * 2 * self.kv_heads * self.head_dim
