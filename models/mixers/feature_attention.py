"""FeatureMapAttention: the linear attention that `linear`, `performer`, `hedgehog` and
Based's Taylor part share; a subclass gives only its feature map and its feature count.

q, k, v projections [-> short conv] -> phi(q), phi(k) -> kernels.ops.linear_attention
-> output projection, with state S (B, H, F, Dv) and, when normalised, z (B, H, F).

cfg.short_conv (fla's use_short_conv) puts a causal depthwise conv + SiLU
(models.layers.ShortConv, conv_size taps, no bias: fla's ShortConvolution defaults) on
each of q, k and v after its projection and before the feature map, as fla's layers
order them; its decode state is the last conv_size - 1 projected inputs of each. Its
FLOPs are its weights' (one multiply-add per tap, channel and token), which models.flops
counts at 2 per weight, so flops_per_token needs no term for it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import context_parallel
from kernels.common import masked_exp, run_ids, segsum, visible_keys
from models.config import ModelConfig
from models.layers import ShortConv, dense, dtypes, rotary, segment_positions
from models.mixers.recurrent import RecurrentMixer

# Added to the row sums of attention_weights (LoLCATs' quadratic_attention: 1e-12). Its
# square is a normal float32, so the division's gradient -x / y^2 stays finite on a row
# whose features share no support (sum 0); 1e-30 squared underflows to 0 (0 / 0 = NaN).
WEIGHTS_EPS = 1e-12


class FeatureMapAttention(RecurrentMixer):
    """normalize=True divides by phi(q) . sum phi(k) (Katharopoulos et al. 2020).

    qk_dim is the width of q and k per head before the feature map (head_dim unless the
    subclass projects elsewhere, as Based does)."""

    normalize = True
    # kernels.ops.linear_attention's eps, o = num / (den + eps) (normalised maps)
    denominator_eps = 1e-6

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, qk_dim: int = 0):
        super().__init__(cfg)
        h, d = self.num_heads, self.head_dim
        self.qk_dim = f = qk_dim or d
        qkv, o = {"use_bias": cfg.qkv_bias}, {"use_bias": cfg.o_bias}
        self.q_proj = dense(cfg, cfg.d_model, h * f, ("embed", "heads"), rngs=rngs, **qkv)
        self.k_proj = dense(cfg, cfg.d_model, h * f, ("embed", "heads"), rngs=rngs, **qkv)
        self.v_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs, **qkv)
        self.o_proj = dense(cfg, h * d, cfg.d_model, ("heads", "embed"), rngs=rngs, **o)
        # cfg.feature_rope: q, k rotated (models.layers.rotary) before the feature map;
        # the decode state then counts the position ("pos").
        self.feature_rope = cfg.feature_rope
        # Built only when asked for, so a model without it keeps its parameters (and
        # checkpoints) as before.
        self.short_conv = cfg.short_conv
        if cfg.short_conv:  # delta.py's names
            self.q_conv = ShortConv(cfg, h * f, rngs=rngs)
            self.k_conv = ShortConv(cfg, h * f, rngs=rngs)
            self.v_conv = ShortConv(cfg, h * d, rngs=rngs)

    # --- what a subclass provides -------------------------------------------------------
    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        """F, the number of features phi gives per head."""
        raise NotImplementedError

    def _phi(self, x, *, query: bool):
        raise NotImplementedError

    # --- RecurrentMixer's pieces ----------------------------------------------------------
    @classmethod
    def state_dims(cls, cfg: ModelConfig) -> tuple[int, int]:
        return cls.feature_dim(cfg), cfg.resolved_head_dim

    def _inputs(self, x, *, segment_ids, conv_state, positions=None):
        """The op's inputs {"q": phi(q), "k": phi(k), "v"} and the new conv state."""
        pre, new_conv = self._projections(x, segment_ids=segment_ids,
                                          conv_state=conv_state, positions=positions)
        return self._mapped(pre), new_conv

    def _mapped(self, pre):
        """{"q", "k", "v"} before the feature map -> the op's inputs."""
        v = pre["v"]
        return {"q": self._phi(pre["q"], query=True).astype(v.dtype),
                "k": self._phi(pre["k"], query=False).astype(v.dtype), "v": v}

    def _projections(self, x, *, segment_ids, conv_state, positions=None):
        """q, k, v (B, T, H, .) after the projections, the short conv and feature_rope,
        before the feature map, and the new conv state (None without a short conv)."""
        b, t, _ = x.shape
        qkv = {"q": self.q_proj(x), "k": self.k_proj(x), "v": self.v_proj(x)}
        new_conv = None
        if self.short_conv:
            cs = conv_state or {}
            outs = {n: self._conv(n)(a, segment_ids=segment_ids, state=cs.get(n))
                    for n, a in qkv.items()}
            qkv = {n: y for n, (y, _) in outs.items()}
            new_conv = {n: s for n, (_, s) in outs.items()}
        q = qkv["q"].reshape(b, t, self.num_heads, self.qk_dim)
        k = qkv["k"].reshape(b, t, self.num_heads, self.qk_dim)
        v = qkv["v"].reshape(b, t, self.num_heads, self.head_dim)
        if self.feature_rope:
            if positions is None:
                positions = segment_positions(segment_ids, t)
            q, k = rotary(self.cfg, q, positions), rotary(self.cfg, k, positions)
        return {"q": q, "k": k, "v": v}, new_conv

    def init_state(self, batch: int, max_len: int = 0):
        state = super().init_state(batch, max_len)
        if self.feature_rope:
            state["pos"] = jnp.zeros((), jnp.int32)
        return state

    def _run(self, x, state, *, impl):
        if not self.feature_rope:
            return super()._run(x, state, impl=impl)
        pos = state["pos"]
        positions = pos + jnp.arange(x.shape[1], dtype=jnp.int32)[None]
        inputs, conv = self._inputs(x, segment_ids=None, conv_state=state.get("conv"),
                                    positions=positions)
        o, attn = self._op(inputs, segment_ids=None, initial_state=state["attn"],
                           return_state=True, impl=impl)
        new = {"attn": attn, "pos": pos + x.shape[1]}
        if conv is not None:
            new["conv"] = conv
        return self._output(o, x, inputs), new

    def _conv(self, name: str) -> ShortConv:
        return getattr(self, f"{name}_conv")

    def _conv_state(self, batch: int):
        if not self.short_conv:
            return None
        h, dtype = self.num_heads, dtypes(self.cfg)[0]
        widths = {"q": h * self.qk_dim, "k": h * self.qk_dim, "v": h * self.head_dim}
        return {n: self._conv(n).init_state(batch, c, dtype) for n, c in widths.items()}

    def _op(self, inputs, *, segment_ids, initial_state, return_state, impl):
        return context_parallel.linear_attention(
            inputs["q"], inputs["k"], inputs["v"], normalize=self.normalize,
            eps=self.denominator_eps, segment_ids=segment_ids, initial_state=initial_state,
            return_state=return_state, impl=impl, chunk_size=self.cfg.chunk_size,
            taylor_qk=inputs.get("taylor_qk"))

    # --- attention weights --------------------------------------------------------------
    @classmethod
    def has_attention_weights(cls, cfg: ModelConfig) -> bool:
        return cls.normalize

    def _weight_features(self, inputs, run):
        """(phi(q), phi(k) (B, T, H, F), log decay (B, T, H) or None): what the op
        multiplies, with the per-token log decay it applies to the state between keys
        (run (B, T): each token's document, kernels.common.run_ids)."""
        return inputs["q"], inputs["k"], None

    def attention_weights(self, x, segment_ids=None):
        """phi(q_t) . phi(k_s) (times the decay the op applies between s and t) over the
        causal keys of the same document, divided by their sum: the weights the
        normalised linear attention applies to the values."""
        if not self.normalize:
            raise ValueError(f"mixer {self.name!r} is not normalised (no attention "
                             f"weights); use convert.loss=output_mse")
        b, t, _ = x.shape
        inputs, _ = self._inputs(x, segment_ids=segment_ids, conv_state=None)
        run = run_ids(segment_ids, b, t)
        phi_q, phi_k, log_decay = self._weight_features(inputs, run)
        visible = visible_keys(t, run)                                   # (B, 1, T, S)
        scores = jnp.einsum("bthf,bshf->bhts", phi_q.astype(jnp.float32),
                            phi_k.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
        if log_decay is not None:
            scores = scores * masked_exp(visible, segsum(jnp.moveaxis(log_decay, 1, 2)))
        scores = jnp.where(visible, scores, 0.0)
        return scores / (jnp.sum(scores, axis=-1, keepdims=True) + WEIGHTS_EPS)

    def _output(self, o, x, inputs):
        b, t = o.shape[:2]
        return self.o_proj(o.reshape(b, t, -1))
