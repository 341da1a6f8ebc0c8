"""Based (Arora et al. 2024): Taylor linear attention plus exact sliding-window softmax.

The linear part projects q and k to cfg.based_feature_dim (16) per head, scales them by
d^(-1/4) and applies the second-order Taylor map, so phi(q) . phi(k) = 1 + s + s^2/2 with
s = q . k / sqrt(d), normalised as in Based's `LinearAttention`. The map stores each
symmetric pair of the outer product once (fm.taylor_symmetric: 153 features at d = 16
where Based's code keeps all 273): the same kernel, so the same model, with a 44%
smaller Taylor state, which the Pallas kernel runs padded to 256 features on GPU. The
window part is exact softmax over the last cfg.window tokens (64).
Two mixers, named for what they are:
- `taylor`: the Taylor linear attention alone, Based's `LinearAttention` layer (and
  Zoology's MQAR Based, which has no window). The Based language model interleaves it
  with separate sliding-window and BaseConv layers by layer pattern:
  configs/based_recipe.py.
- `based`: one mixer holding both parts, summing their outputs in every layer, so each
  layer recalls precisely nearby (a cfg.window-token window, 64) and approximately far
  away (Taylor state). Not a layer of the Based paper: this repository's compact form.
cfg.short_conv puts a short conv on the Taylor part's q, k, v (FeatureMapAttention); Based's
and fla's linear-attention layers have none (the Based LM's convs are its BaseConv layers).
"""
from __future__ import annotations

from flax import nnx

from models import feature_maps as fm
from models.config import ModelConfig
from models.mixers.attention import SlidingWindowAttention
from models.mixers.base import Mixer
from models.mixers.feature_attention import FeatureMapAttention
from models.mixers.registry import BASED, TAYLOR, register


@register(TAYLOR)
class TaylorLinearAttention(FeatureMapAttention):
    """Based's linear attention: Taylor features of q, k projected to based_feature_dim."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs, qk_dim=cfg.based_feature_dim)

    @classmethod
    def feature_dim(cls, cfg: ModelConfig) -> int:
        return fm.taylor_symmetric_dim(cfg.based_feature_dim)

    def _phi(self, x, *, query: bool):
        return fm.taylor_symmetric(self._scaled(x))

    def _scaled(self, x):
        return x * self.qk_dim ** -0.25

    def _mapped(self, pre):
        # with the features, the scaled q, k they are made of: the op's Pallas path forms
        # its in-chunk scores from these 16 numbers a token rather than from 153 features
        inputs = super()._mapped(pre)
        inputs["taylor_qk"] = tuple(self._scaled(pre[n]).astype(pre["v"].dtype)
                                    for n in "qk")
        return inputs


@register(BASED)
class Based(Mixer):
    """The sum of its two parts, in every method of the interface."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg  # as every mixer's (training.convert_loss asks the mixer's config)
        self.linear = TaylorLinearAttention(cfg, rngs=rngs)
        self.window = SlidingWindowAttention(cfg, rngs=rngs)

    def __call__(self, x, *, segment_ids=None):
        return self.linear(x, segment_ids=segment_ids) + self.window(x, segment_ids=segment_ids)

    def init_state(self, batch: int, max_len: int = 0):
        return {"linear": self.linear.init_state(batch),
                "window": self.window.init_state(batch, max_len)}

    def prefill(self, x, state):
        y1, s1 = self.linear.prefill(x, state["linear"])
        y2, s2 = self.window.prefill(x, state["window"])
        return y1 + y2, {"linear": s1, "window": s2}

    def step(self, x_t, state):
        y1, s1 = self.linear.step(x_t, state["linear"])
        y2, s2 = self.window.step(x_t, state["window"])
        return y1 + y2, {"linear": s1, "window": s2}

    def state_size(self) -> int:
        return self.linear.state_size() + self.window.state_size()

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        return (TaylorLinearAttention.flops_per_token(cfg, seq_len)
                + SlidingWindowAttention.flops_per_token(cfg, seq_len))
