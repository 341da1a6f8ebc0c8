"""Linear attention with a feature map: `linear` (elu+1 / relu / identity), `performer`
(FAVOR+), `hedgehog` (learned maps). All are kernels.ops.linear_attention on phi(q),
phi(k), v, with state S (B, H, F, Dv) and, when normalised, z (B, H, F)."""
from __future__ import annotations

from flax import nnx

from kernels import ops
from models import feature_maps as fm
from models.config import ModelConfig
from models.layers import Buffer, dense, meta, dtypes
from models.mixers.recurrent import RecurrentMixer, zeros_state
from models.mixers.registry import register


class _FeatureMapAttention(RecurrentMixer):
    """q, k, v projections -> phi(q), phi(k) -> linear_attention -> output projection.

    normalize=True divides by phi(q) . sum phi(k) (Katharopoulos et al. 2020).
    """

    normalize = True

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, qk_dim: int = 0):
        super().__init__(cfg)
        h, d = self.num_heads, self.head_dim
        self.qk_dim = qk_dim or d  # width of q, k per head before the feature map
        self.q_proj = dense(cfg, cfg.d_model, h * self.qk_dim, ("embed", "heads"), rngs=rngs)
        self.k_proj = dense(cfg, cfg.d_model, h * self.qk_dim, ("embed", "heads"), rngs=rngs)
        self.v_proj = dense(cfg, cfg.d_model, h * d, ("embed", "heads"), rngs=rngs)
        self.o_proj = dense(cfg, h * d, cfg.d_model, ("heads", "embed"), rngs=rngs)

    def feature_dim(self) -> int:
        raise NotImplementedError

    def _phi(self, x, *, query: bool):
        raise NotImplementedError

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

    def _op_state(self, batch: int):
        return zeros_state(batch, self.num_heads, self.feature_dim(), self.head_dim,
                           normalize=self.normalize)


@register("linear")
class LinearAttention(_FeatureMapAttention):
    """Katharopoulos et al. (2020) with phi = cfg.feature_map (elu, relu, identity, dpfp).

    elu+1, relu and DPFP (Schlag et al. 2021, nu = 1: 2 d sparse features) are normalised
    by the usual denominator. identity has negative
    features, so a denominator could cross zero (seed 000's warning): it runs without one
    and normalises the output per head with an RMSNorm instead (TransNormer, RetNet).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.phi = fm.dpfp if cfg.feature_map == "dpfp" else fm.SIMPLE_MAPS[cfg.feature_map]
        self.normalize = cfg.feature_map != "identity"
        if not self.normalize:
            dtype, param_dtype = dtypes(cfg)
            self.o_norm = nnx.RMSNorm(self.head_dim, epsilon=cfg.norm_eps, dtype=dtype,
                                      param_dtype=param_dtype, scale_metadata=meta("norm"),
                                      rngs=rngs)

    def feature_dim(self) -> int:
        return 2 * self.head_dim if self.cfg.feature_map == "dpfp" else self.head_dim

    def _phi(self, x, *, query: bool):
        return self.phi(x)

    def _output(self, o, x):
        if not self.normalize:
            o = self.o_norm(o)
        return super()._output(o, x)


@register("performer")
class Performer(_FeatureMapAttention):
    """FAVOR+ (Choromanski et al. 2020): m positive orthogonal random features of
    q, k / d^(1/4). omega is drawn once at init and kept as a non-trainable Buffer, so
    the full call and decode use the same features."""

    feature_eps = 1e-4  # keeps every feature strictly positive (Performer's kernel_epsilon)

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.omega = Buffer(fm.gaussian_projection(
            rngs.params(), cfg.num_random_features, self.head_dim, orthogonal=True))

    def feature_dim(self) -> int:
        return self.cfg.num_random_features

    def _phi(self, x, *, query: bool):
        return fm.favor_plus(x, self.omega[...], scale=self.head_dim ** -0.25, query=query,
                             eps=self.feature_eps)


@register("hedgehog")
class Hedgehog(_FeatureMapAttention):
    """Hedgehog (Zhang et al. 2024): a learned map per head, [softmax(Wx), softmax(-Wx)],
    shared by the head's queries and keys, W initialised to the identity; normalised."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.feature_map = fm.HedgehogFeatureMap(self.num_heads, self.head_dim,
                                                 param_dtype=dtypes(cfg)[1])

    def feature_dim(self) -> int:
        return 2 * self.head_dim

    def _phi(self, x, *, query: bool):
        return self.feature_map(x)
