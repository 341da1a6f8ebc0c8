"""`hedgehog_window`: LoLCATs' layer (Zhang et al. 2024, "LoLCATs: On Low-Rank
Linearizing of Large Language Models"; HazyResearch/lolcats'
LolcatsSlidingWindowAttention): softmax over the last cfg.window keys (64) and Hedgehog
linear attention (fla's softmax map of a learned affine map per head, as `hedgehog` with
hedgehog_map "softmax") over every older key, sharing one normaliser; the window's
weights scaled by sigmoid(window_factors) per head (LoLCATs' init 0: one half), the linear
part's by 1 (LoLCATs' affine_attention_factors=False). RoPE (cfg.positions "rope") turns
q and k before both parts, as LoLCATs applies its feature maps to the rotated q and k.
The formula and its three forms: kernels.window_linear.

cfg.impl "parallel" runs the quadratic reference form; any other value the blocked form,
whose linear part goes to kernels.ops.linear_attention with that impl. Decoding keeps the
last cfg.window keys and values and the linear state of the older keys: a fixed-size
state. Under a `sequence` mesh (context parallelism) the linear part runs split; see
kernels.window_linear.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import window_linear
from models import feature_maps as fm
from models.config import ModelConfig
from models.layers import dense, dtypes, rotary, segment_positions
from models.mixers.attention import SlidingWindowAttention
from models.mixers.base import Mixer
from models.mixers.linear import Hedgehog
from models.mixers.registry import HEDGEHOG_WINDOW, register


@register(HEDGEHOG_WINDOW)
class HedgehogWindowAttention(Mixer):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.num_heads = h = cfg.num_heads
        self.head_dim = d = cfg.resolved_head_dim
        self.window = cfg.window
        qkv, o = {"use_bias": cfg.qkv_bias}, {"use_bias": cfg.o_bias}
        self.q_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.k_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.v_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.o_proj = dense(cfg, h * d, cfg.d_model, ("heads", "embed"), rngs=rngs, **o)
        param_dtype = dtypes(cfg)[1]
        self.feature_map_q = fm.HedgehogFeatureMap(h, d, param_dtype=param_dtype)
        self.feature_map_k = fm.HedgehogFeatureMap(h, d, param_dtype=param_dtype)
        self.window_factors = nnx.Param(jnp.zeros((h,), param_dtype),
                                        sharding_names=("heads",), eager_sharding=False)

    def _qkv(self, x, positions):
        b, t, _ = x.shape
        shape = (b, t, self.num_heads, self.head_dim)
        q = rotary(self.cfg, self.q_proj(x).reshape(shape), positions)
        k = rotary(self.cfg, self.k_proj(x).reshape(shape), positions)
        return q, k, self.v_proj(x).reshape(shape)

    def _gamma(self):
        return jax.nn.sigmoid(self.window_factors[...].astype(jnp.float32))

    def _out(self, o):
        b, t = o.shape[:2]
        return self.o_proj(o.reshape(b, t, -1))

    def inputs(self, x, segment_ids=None):
        """q, k (rotated), phi(q), phi(k), v of x (B, T, d_model), each (B, T, H, .)."""
        q, k, v = self._qkv(x, segment_positions(segment_ids, x.shape[1]))
        fq = self.feature_map_q(q).astype(v.dtype)
        fk = self.feature_map_k(k).astype(v.dtype)
        return q, k, fq, fk, v

    @classmethod
    def has_attention_weights(cls, cfg: ModelConfig) -> bool:
        return True

    def attention_weights(self, x, segment_ids=None):
        """The window's and the linear part's weights together, over their one
        normaliser (Mixer.attention_weights)."""
        q, k, fq, fk, _ = self.inputs(x, segment_ids)
        return window_linear.hybrid_weights(q, k, fq, fk, self._gamma(), window=self.window,
                                            segment_ids=segment_ids)

    def __call__(self, x, *, segment_ids=None):
        return self._out(self._mix(*self.inputs(x, segment_ids), segment_ids))

    def _mix(self, q, k, fq, fk, v, segment_ids=None):
        if self.cfg.impl == "parallel":
            return window_linear.hybrid_quadratic(q, k, fq, fk, v, self._gamma(),
                                                  window=self.window, segment_ids=segment_ids)
        return window_linear.hybrid_blocked(q, k, fq, fk, v, self._gamma(),
                                            window=self.window, segment_ids=segment_ids,
                                            impl=self.cfg.impl, chunk_size=self.cfg.chunk_size)

    def init_state(self, batch: int, max_len: int = 0):
        d = self.head_dim
        return window_linear.init_state(batch, self.num_heads, d, d, 2 * d, self.window,
                                        dtypes(self.cfg)[0])

    def step(self, x_t, state):
        q, k, v = self._qkv(x_t[:, None], jnp.full((1, 1), state["pos"], jnp.int32))
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
        fq = self.feature_map_q(q)
        y, state = window_linear.hybrid_step(
            q, k, fq, v, self._gamma(), state,
            lambda keys: self.feature_map_k(keys.astype(jnp.float32)))
        return self._out(y[:, None])[:, 0], state

    def prefill(self, x, state):
        """From a fresh state (position 0) the whole prompt in the training form and the
        state it leaves (window_linear.state_after); from any other (a prompt in pieces)
        token by token, the decode form."""
        def fresh(state):
            q, k, fq, fk, v = self.inputs(x)
            keys = self.feature_map_k(k.astype(jnp.float32))  # as step() makes them
            return (self._out(self._mix(q, k, fq, fk, v)),
                    window_linear.state_after(k, v, keys, self.window, state["k"].dtype))

        def token_by_token(state):
            def one(carry, x_t):
                y_t, carry = self.step(x_t, carry)
                return carry, y_t

            state, ys = jax.lax.scan(one, state, jnp.moveaxis(x, 1, 0))
            return jnp.moveaxis(ys, 0, 1), state

        return jax.lax.cond(state["pos"] == 0, fresh, token_by_token, state)

    def state_size(self) -> int:
        h, d, w = self.num_heads, self.head_dim, self.window
        return 2 * w * h * d + h * 2 * d * d + h * 2 * d

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        return (SlidingWindowAttention.flops_per_token(cfg, seq_len)
                + Hedgehog.flops_per_token(cfg, seq_len))
