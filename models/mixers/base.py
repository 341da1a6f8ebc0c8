"""The one interface every sequence mixer implements (docs/INTERFACES.md, "Adding a mixer").

A mixer maps x (B, T, d_model) to y (B, T, d_model) causally, decodes one token at a time
from a state, and says what that state and its FLOPs cost. `registry.register` refuses a
class that leaves any method of INTERFACE to Mixer's placeholders, so a mixer missing a
piece fails when its module is imported, not part-way through a run.
"""
from __future__ import annotations

from flax import nnx

from models.config import ModelConfig


class Mixer(nnx.Module):
    """Built as `Mixer(cfg: ModelConfig, *, rngs: nnx.Rngs)`; `name` is set by register."""

    name = ""
    # True: the decode state is a cache that grows by state_size() numbers per token
    # (softmax's KV cache). False: the state has a fixed size, whatever the length.
    state_grows = False
    # True: __call__ also takes `deterministic` (dropout inside the mixer), which Block
    # passes (False while training).
    takes_deterministic = False

    def __call__(self, x, *, segment_ids=None):
        """x (B, T, d_model) -> y (B, T, d_model). segment_ids (B, T) int: tokens of
        different segments (packed documents) never interact."""
        raise NotImplementedError

    def init_state(self, batch: int, max_len: int):
        """The decode state of a fresh sequence: a pytree of arrays (a KV cache of max_len
        tokens for softmax; fixed-size mixers ignore max_len)."""
        raise NotImplementedError

    def prefill(self, x, state):
        """A prompt x (B, T, d_model) from a fresh state -> (y, state after it)."""
        raise NotImplementedError

    def step(self, x_t, state):
        """One token x_t (B, d_model) -> (y_t (B, d_model), next state)."""
        raise NotImplementedError

    def state_size(self) -> int:
        """Numbers held per sequence while decoding (per cached token when state_grows)."""
        raise NotImplementedError

    @classmethod
    def flops_per_token(cls, cfg: ModelConfig, seq_len: int) -> float:
        """Forward FLOPs per token of the sequence mixing at context seq_len: what is left
        when every weight has been counted at 2 FLOPs per token (models.flops adds those).
        A classmethod, so a run's FLOPs need only its config, not a built model."""
        raise NotImplementedError

    # --- optional: attention weights (training.convert_loss's attention_ce and agreement)
    @classmethod
    def has_attention_weights(cls, cfg: ModelConfig) -> bool:
        """Whether a mixer of this config defines attention_weights: its output is a set
        of normalised weights over the keys applied to the values, as softmax's. A
        classmethod, so a conversion checks its config before building a model."""
        return False

    def attention_weights(self, x, segment_ids=None):
        """(B, H, T, T) float32 on x (B, T, d_model): each query's weights over the keys,
        0 on keys it cannot see, rows summing to 1. Only where has_attention_weights."""
        raise NotImplementedError(f"mixer {self.name!r} has no attention weights")


INTERFACE = ("__call__", "init_state", "prefill", "step", "state_size", "flops_per_token")


def missing_methods(cls: type) -> list[str]:
    """The methods of INTERFACE that cls inherits unimplemented from Mixer."""
    def owner(method):
        return next(k for k in cls.__mro__ if method in vars(k))
    return [m for m in INTERFACE if owner(m) is Mixer]
