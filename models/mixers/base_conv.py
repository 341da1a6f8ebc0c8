"""The two gated short convolutions of the Zoology and Based papers (Arora et al. 2023,
2024), each transcribed from its reference code; both are a hybrid's building blocks.

`base_conv`: Zoology's BaseConv, zoology/mixers/base_conv.py with its defaults
(kernel_size=3, use_act=False):

  y = conv(u) * projection(u) + u

conv is a causal depthwise Conv1d over time with a bias (torch's default; Zoology's
ShortConvolution pads kernel_size-1 and keeps the first T outputs: no activation),
projection an nn.Linear(d_model, d_model) with a bias. The "+ u" is inside the mixer,
as in Zoology (the block adds its own residual around it). Zoology's MQAR models are
Hybrid([BaseConv, mixer]): layer i takes configs[i % 2], i.e. layer_pattern
"base_conv,mixer". Decode state: the conv's last base_conv_size - 1 inputs.

`gated_conv`: the Based language model's BaseConv, based/models/mixers/convolution.py
(use_bias=True, expand_proj=cfg.gated_conv_expand, 4 in Based's reference configs;
kernel 3; its ShortConvolution has no conv bias and the SiLU follows it):

  u1, u2 = split(in_proj(u))            in_proj: d_model -> expand d_model, halves of
  y = out_proj(silu(conv(u1)) * u2)     d_inner = expand d_model / 2; no "+ u" here
Decode state: the conv's last base_conv_size - 1 inputs of u1.

Init: both references re-draw every nn.Linear of the model from N(0, 0.02) with zero
bias (zoology/model.py and based/models/gpt.py `_init_weights`; Based also scales
out_proj by 1/sqrt(2 n_layers), GPT-2's rule); their convs keep torch's Conv1d default
(ShortConv's). The gate then starts small, so each layer starts close to its "+ u" /
zero output. Done here for these two mixers; the others keep nnx's default init.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from models.config import ModelConfig
from models.layers import ShortConv, dense, dtypes
from models.mixers.base import Mixer
from models.mixers.registry import BASE_CONV, GATED_CONV, register

REFERENCE_INIT_STD = 0.02  # Zoology's and Based's initializer_range


def _normal(std: float):
    return nnx.initializers.normal(std)


class _ConvMixer(Mixer):
    """What both convolutions share: a subclass gives `self.conv` (a ShortConv over
    `self.conv_channels` channels) and `_mix(u, segment_ids, state) -> (y, conv state)`;
    the full call, prefill and decode step all run `_mix`, so they run the same math."""

    def _mix(self, u, *, segment_ids, state):
        raise NotImplementedError

    def __call__(self, x, *, segment_ids=None):
        return self._mix(x, segment_ids=segment_ids, state=None)[0]

    def init_state(self, batch: int, max_len: int = 0):
        return {"conv": self.conv.init_state(batch, self.conv_channels, dtypes(self.cfg)[0])}

    def prefill(self, x, state):
        y, conv = self._mix(x, segment_ids=None, state=state["conv"])
        return y, {"conv": conv}

    def step(self, x_t, state):
        y, conv = self._mix(x_t[:, None], segment_ids=None, state=state["conv"])
        return y[:, 0], {"conv": conv}

    def state_size(self) -> int:
        return (self.cfg.base_conv_size - 1) * self.conv_channels

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Nothing beyond its weights: each conv tap and projection weight is one
        multiply-add per token, so the 2-per-weight count (models.flops) is exact; the
        gate's product and the residual add are elementwise, which no mixer counts."""
        return 0.0


@register(BASE_CONV)
class BaseConv(_ConvMixer):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = self.conv_channels = cfg.d_model
        self.projection = dense(cfg, d, d, ("embed", "heads"), rngs=rngs, use_bias=True,
                                kernel_init=_normal(REFERENCE_INIT_STD))
        self.conv = ShortConv(cfg, d, rngs=rngs, size=cfg.base_conv_size, bias=True,
                              activation=False)

    def _mix(self, u, *, segment_ids, state):
        u_conv, state = self.conv(u, segment_ids=segment_ids, state=state)
        return u_conv * self.projection(u) + u, state


@register(GATED_CONV)
class GatedConv(_ConvMixer):

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.d_model
        self.d_inner = self.conv_channels = cfg.gated_conv_expand * d // 2
        self.in_proj = dense(cfg, d, 2 * self.d_inner, ("embed", "heads"), rngs=rngs,
                             use_bias=True, kernel_init=_normal(REFERENCE_INIT_STD))
        self.conv = ShortConv(cfg, self.d_inner, rngs=rngs, size=cfg.base_conv_size)
        self.out_proj = dense(cfg, self.d_inner, d, ("heads", "embed"), rngs=rngs,
                              use_bias=True, kernel_init=_normal(
                                  REFERENCE_INIT_STD / math.sqrt(2 * cfg.num_layers)))

    def _mix(self, u, *, segment_ids, state):
        u1, u2 = jnp.split(self.in_proj(u), 2, axis=-1)
        u_conv, state = self.conv(u1, segment_ids=segment_ids, state=state)  # with SiLU
        return self.out_proj(u_conv * u2), state
