"""Linear attention with a feature map: `linear` (elu+1 / relu / identity / dpfp),
`performer` (FAVOR+), `hedgehog` (learned maps). All are FeatureMapAttention: each gives
its map phi and its feature count F."""
from __future__ import annotations

from flax import nnx

from models import feature_maps as fm
from models.config import ModelConfig
from models.layers import Buffer, meta, dtypes
from models.mixers.feature_attention import FeatureMapAttention
from models.mixers.registry import HEDGEHOG, LINEAR, PERFORMER, register


@register(LINEAR)
class LinearAttention(FeatureMapAttention):
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

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        d = cfg.resolved_head_dim
        return 2 * d if cfg.feature_map == "dpfp" else d

    def _phi(self, x, *, query: bool):
        return self.phi(x)

    def _output(self, o, x):
        if not self.normalize:
            o = self.o_norm(o)
        return super()._output(o, x)


@register(PERFORMER)
class Performer(FeatureMapAttention):
    """FAVOR+ (Choromanski et al. 2020): m positive orthogonal random features of
    q, k / d^(1/4). omega is drawn once at init and kept as a non-trainable Buffer, so
    the full call and decode use the same features."""

    feature_eps = 1e-4  # keeps every feature strictly positive (Performer's kernel_epsilon)

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.omega = Buffer(fm.gaussian_projection(
            rngs.params(), cfg.num_random_features, self.head_dim, orthogonal=True))

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        return cfg.num_random_features

    def _phi(self, x, *, query: bool):
        return fm.favor_plus(x, self.omega[...], scale=self.head_dim ** -0.25, query=query,
                             eps=self.feature_eps)


@register(HEDGEHOG)
class Hedgehog(FeatureMapAttention):
    """Hedgehog (Zhang et al. 2024): a learned map per head, [softmax(Wx), softmax(-Wx)],
    shared by the head's queries and keys, W initialised to the identity; normalised."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.feature_map = fm.HedgehogFeatureMap(self.num_heads, self.head_dim,
                                                 param_dtype=dtypes(cfg)[1])

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        return 2 * cfg.resolved_head_dim

    def _phi(self, x, *, query: bool):
        return self.feature_map(x)
