"""Auxiliary training losses that layers add beside the next-token loss.

A layer adds one while training by sowing it (`sow_auxiliary_loss`: an nnx.Intermediate
named AUX_LOSS, already weighted and averaged); the train step
(training.step.make_train_step) runs the model under nnx.capture and adds `total` of what
was sown to the mean next-token loss it minimises. The logged loss stays the next-token
one, so runs with and without an auxiliary loss compare on the same number.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

AUX_LOSS = "aux_loss"


def sow_auxiliary_loss(layer: nnx.Module, value) -> None:
    """Records `value` (a scalar, weighted as it is to be added) on `layer`."""
    layer.sow(nnx.Intermediate, AUX_LOSS, value)


def total(sown) -> jax.Array:
    """The sum of the AUX_LOSS values in `sown` (the nnx.Intermediate State that
    nnx.capture returned; other intermediates are left out), float32, 0 when none."""
    out = jnp.zeros((), jnp.float32)
    for path, leaf in jax.tree_util.tree_flatten_with_path(sown)[0]:
        if any(getattr(key, "key", None) == AUX_LOSS for key in path):
            out = out + jnp.sum(leaf.astype(jnp.float32))
    return out
