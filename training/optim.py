"""AdamW with linear warmup + cosine decay, global-norm clipping and a weight-decay mask.

Parameters are a flat dict {"path/to/param": array}; the mask is decided from the last
path component, the modules on the path (NO_DECAY_MODULES) and, for embeddings, the
parameter's logical axes, the way nanoGPT and most LM codebases exclude norms, biases
and gates from weight decay.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import optax

from models.layer_stack import LAYER_AXIS

# Parameter names never decayed: norm gains, biases, and the decay/step-size gates of
# Mamba-style and gated-delta mixers (decaying them towards 0 changes the memory length).
NO_DECAY_NAMES = frozenset({"scale", "bias", "A_log", "dt_bias"})
# Modules none of whose parameters are decayed: Hedgehog's learned feature maps start at
# the identity, and decay pulls them towards zero, i.e. towards a uniform map (the
# paper's and fla's training applies none to them).
NO_DECAY_MODULES = frozenset({"feature_map_q", "feature_map_k"})


def lr_schedule(lr: float, steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.1):
    """0 -> lr linearly over warmup_steps, then cosine down to lr * min_lr_ratio at
    `steps`."""
    warmup_steps = max(0, min(int(warmup_steps), int(steps) - 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup_steps else lr, peak_value=lr, warmup_steps=warmup_steps,
        decay_steps=max(int(steps), warmup_steps + 1), end_value=lr * min_lr_ratio)


def decay_mask(params: Mapping[str, object],
               logical_axes: Mapping[str, Sequence[str | None] | None] | None = None,
               decay_embeddings: bool = True) -> dict[str, bool]:
    """True where weight decay applies: matrices, not norms/biases/gates (nor embedding
    tables, whose first logical axis is "vocab", when decay_embeddings is False)."""
    logical_axes = logical_axes or {}
    mask = {}
    for name, value in params.items():
        leaf = name.rsplit("/", 1)[-1]
        axes = tuple(logical_axes.get(name) or ())
        # A scanned model's stacked layer axis is not a dimension of the parameter: a
        # stack of vectors (gains, biases) is still vectors, and stays undecayed.
        ndim = getattr(value, "ndim", 2)
        if axes[:1] == (LAYER_AXIS,):
            ndim, axes = ndim - 1, axes[1:]
        decay = (leaf not in NO_DECAY_NAMES and ndim >= 2
                 and not NO_DECAY_MODULES & set(name.split("/")))
        if decay and not decay_embeddings and len(axes) and axes[0] == "vocab":
            decay = False
        mask[name] = decay
    return mask


def make_optimizer(train_cfg, params: Mapping[str, object],
                   logical_axes: Mapping[str, Sequence[str | None] | None] | None = None,
                   schedule=None):
    """(optax transform, schedule) from the config's train section. schedule: the lr
    schedule to use instead of the config's (population training passes one that picks
    each member's own, so a member computes the lr its separate run would)."""
    if schedule is None:
        schedule = lr_schedule(train_cfg.lr, train_cfg.steps, train_cfg.warmup_steps,
                               train_cfg.min_lr_ratio)
    parts = []
    if train_cfg.grad_clip and train_cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(train_cfg.grad_clip))
    parts.append(optax.adamw(
        schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
        weight_decay=train_cfg.weight_decay,
        mask=decay_mask(params, logical_axes, train_cfg.decay_embeddings)))
    return optax.chain(*parts), schedule
