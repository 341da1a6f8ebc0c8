"""FeatureMapAttention: the linear attention that `linear`, `performer`, `hedgehog` and
Based's Taylor part share; a subclass gives only its feature map and its feature count.

q, k, v projections -> phi(q), phi(k) -> kernels.ops.linear_attention -> output
projection, with state S (B, H, F, Dv) and, when normalised, z (B, H, F).
"""
from __future__ import annotations

from flax import nnx

from kernels import ops
from models.config import ModelConfig
from models.layers import dense
from models.mixers.recurrent import RecurrentMixer


class FeatureMapAttention(RecurrentMixer):
    """normalize=True divides by phi(q) . sum phi(k) (Katharopoulos et al. 2020).

    qk_dim is the width of q and k per head before the feature map (head_dim unless the
    subclass projects elsewhere, as Based does)."""

    normalize = True

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, qk_dim: int = 0):
        super().__init__(cfg)
        h, d = self.num_heads, self.head_dim
        self.qk_dim = f = qk_dim or d
        self.q_proj = dense(cfg, cfg.d_model, h * f, ("embed", "heads"), rngs=rngs)
        self.k_proj = dense(cfg, cfg.d_model, h * f, ("embed", "heads"), rngs=rngs)
        self.v_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs)
        self.o_proj = dense(cfg, h * d, cfg.d_model, ("heads", "embed"), rngs=rngs)

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

    def _inputs(self, x, *, segment_ids, conv_state):
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.qk_dim)
        k = self.k_proj(x).reshape(b, t, self.num_heads, self.qk_dim)
        v = self.v_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        q = self._phi(q, query=True).astype(v.dtype)
        k = self._phi(k, query=False).astype(v.dtype)
        return {"q": q, "k": k, "v": v}, None

    def _op(self, inputs, *, segment_ids, initial_state, return_state, impl):
        return ops.linear_attention(
            inputs["q"], inputs["k"], inputs["v"], normalize=self.normalize,
            segment_ids=segment_ids, initial_state=initial_state, return_state=return_state,
            impl=impl, chunk_size=self.cfg.chunk_size)

    def _output(self, o, x):
        b, t = o.shape[:2]
        return self.o_proj(o.reshape(b, t, -1))
