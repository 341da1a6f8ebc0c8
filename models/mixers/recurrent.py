"""The shared skeleton of every mixer with a fixed-size recurrent state.

A subclass says how to turn x into the op's inputs (`_inputs`), which op to run (`_op`)
and how to turn the op's output into y (`_output`). This class then gives the full
call, prefill and decode step from those three pieces, so all three run the same math:
the full call uses cfg.impl (chunk/parallel/...), a decode step the same op with
impl="recurrent" on one token, starting from the state the previous step returned.
The op's state S is (H, F, Dv) per sequence with (F, Dv) = `state_dims(cfg)`; its zero
state and the FLOPs per token both come from those two numbers, so they cannot disagree.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.mixers.base import Mixer


# A prefill longer than this many tokens runs piece by piece, carrying the state (and the
# short conv's), so its feature maps and chunk tensors exist for one piece at a time:
# Based's whole-prompt prefill of B64 x T32768 (then 273 float32 Taylor features a head)
# asked an H200 for 354 GiB. Exact: each piece starts from the state the last one left.
PREFILL_SEGMENT = 8192


class RecurrentMixer(Mixer):
    # True: the op also keeps the denominator's running sum z (H, F) beside S.
    normalize = False

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.resolved_head_dim

    # --- what a subclass provides -------------------------------------------------------
    def _inputs(self, x, *, segment_ids, conv_state):
        """x (B, T, d_model) -> (dict of op inputs, new conv state or None)."""
        raise NotImplementedError

    def _op(self, inputs, *, segment_ids, initial_state, return_state, impl):
        raise NotImplementedError

    def _output(self, o, x, inputs):
        """op output (B, T, H, Dv), the mixer input x and _inputs' dict (a projection
        made in the same matmul as q, k and v travels in it) -> y (B, T, d_model)."""
        raise NotImplementedError

    @classmethod
    def state_dims(cls, cfg: ModelConfig) -> tuple[int, int]:
        """(F, Dv): the op state S is (H, F, Dv). Keys and values of head_dim by default."""
        d = cfg.resolved_head_dim
        return d, d

    def _op_state(self, batch: int):
        """The op's zero state (array or tuple of arrays, float32)."""
        return zeros_state(batch, self.num_heads, *self.state_dims(self.cfg),
                           normalize=self.normalize)

    def _conv_state(self, batch: int):
        return None  # mixers with a short conv override

    # --- the interface ------------------------------------------------------------------
    def __call__(self, x, *, segment_ids=None):
        inputs, _ = self._inputs(x, segment_ids=segment_ids, conv_state=None)
        o = self._op(inputs, segment_ids=segment_ids, initial_state=None, return_state=False,
                     impl=self.cfg.impl)
        return self._output(o, x, inputs)

    def init_state(self, batch: int, max_len: int = 0):
        state = {"attn": self._op_state(batch)}
        conv = self._conv_state(batch)
        if conv is not None:
            state["conv"] = conv
        return state

    def prefill(self, x, state):
        ys = []
        for start in range(0, x.shape[1], PREFILL_SEGMENT):
            y, state = self._run(x[:, start:start + PREFILL_SEGMENT], state,
                                 impl=self.cfg.impl)
            ys.append(y)
        return (ys[0] if len(ys) == 1 else jnp.concatenate(ys, axis=1)), state

    def step(self, x_t, state):
        y, state = self._run(x_t[:, None], state, impl="recurrent")
        return y[:, 0], state

    def _run(self, x, state, *, impl):
        inputs, conv = self._inputs(x, segment_ids=None, conv_state=state.get("conv"))
        o, attn = self._op(inputs, segment_ids=None, initial_state=state["attn"],
                           return_state=True, impl=impl)
        new = {"attn": attn}
        if conv is not None:
            new["conv"] = conv
        return self._output(o, x, inputs), new

    def state_size(self) -> int:
        """Numbers held per sequence while decoding (counted from the state's shapes)."""
        leaves = jax.tree.leaves(jax.eval_shape(lambda: self.init_state(1)))
        return int(sum(leaf.size for leaf in leaves))

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Recurrent form, per head and token: a state write (2 F Dv) and a read (2 F Dv),
        whatever the context length (seed 000's cost model)."""
        f, dv = cls.state_dims(cfg)
        return 4.0 * cfg.num_heads * f * dv


def zeros_state(batch, heads, f, dv, *, normalize: bool):
    s = jnp.zeros((batch, heads, f, dv), jnp.float32)
    return (s, jnp.zeros((batch, heads, f), jnp.float32)) if normalize else s
