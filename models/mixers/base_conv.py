"""BaseConv (Arora et al., Zoology 2023), transcribed from zoology/mixers/base_conv.py with
its defaults (kernel_size=3, use_act=False):

  y = conv(u) * projection(u) + u

conv is a causal depthwise Conv1d over time with a bias (torch's default; Zoology's
ShortConvolution pads kernel_size-1 and keeps the first T outputs: no activation),
projection an nn.Linear(d_model, d_model) with a bias. The "+ u" is inside the mixer,
as in Zoology (the block adds its own residual around it). Zoology's MQAR models are
Hybrid([BaseConv, mixer]): layer i takes configs[i % 2], i.e. layer_pattern
"base_conv,<mixer>". Decode state: the conv's last base_conv_size - 1 inputs.
"""
from __future__ import annotations

from flax import nnx

from models.config import ModelConfig
from models.layers import ShortConv, dense, dtypes
from models.mixers.base import Mixer
from models.mixers.registry import BASE_CONV, register


@register(BASE_CONV)
class BaseConv(Mixer):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.d_model
        self.projection = dense(cfg, d, d, ("embed", "heads"), rngs=rngs, use_bias=True)
        self.conv = ShortConv(cfg, d, rngs=rngs, size=cfg.base_conv_size, bias=True,
                              activation=False)

    def _mix(self, u, *, segment_ids, state):
        u_conv, state = self.conv(u, segment_ids=segment_ids, state=state)
        return u_conv * self.projection(u) + u, state

    def __call__(self, x, *, segment_ids=None):
        return self._mix(x, segment_ids=segment_ids, state=None)[0]

    def init_state(self, batch: int, max_len: int = 0):
        return {"conv": self.conv.init_state(batch, self.cfg.d_model, dtypes(self.cfg)[0])}

    def prefill(self, x, state):
        y, conv = self._mix(x, segment_ids=None, state=state["conv"])
        return y, {"conv": conv}

    def step(self, x_t, state):
        y, conv = self._mix(x_t[:, None], segment_ids=None, state=state["conv"])
        return y[:, 0], {"conv": conv}

    def state_size(self) -> int:
        return (self.cfg.base_conv_size - 1) * self.cfg.d_model

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Nothing beyond its weights: each conv tap and projection weight is one
        multiply-add per token, so the 2-per-weight count (models.flops) is exact for
        both; the gate's product and the residual add are elementwise, which no mixer
        counts."""
        return 0.0
