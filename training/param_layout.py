"""Checkpoints across scan_layers: restore one saved in the other parameter layout.

A scanned model (models.layer_stack) names its layers' parameters "scan_blocks/j/..."
stacked on a leading axis, an unrolled one "blocks/i/...". A checkpoint is restored in
the layout it was written in (targets derived from the model's own, on the model's
shardings with the layer axis added or dropped) and converted, exactly, to the model's
layout: the parameters and every per-parameter dict of the optimizer state (Adam's
moments). So an unrolled run resumes scanned and vice versa, and eval loads either.
"""
from __future__ import annotations

from typing import Any, Collection

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import layer_stack


def _sharding_with_layer_axis(sharding):
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, P(None, *sharding.spec))
    return sharding


def _sharding_without_layer_axis(sharding):
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, P(*tuple(sharding.spec)[1:]))
    return sharding


def _stack_abstract(xs: list):
    x = xs[0]
    return jax.ShapeDtypeStruct((len(xs),) + tuple(x.shape), x.dtype,
                                sharding=_sharding_with_layer_axis(x.sharding))


def _take_abstract(x, repeat: int):
    del repeat
    return jax.ShapeDtypeStruct(tuple(x.shape)[1:], x.dtype,
                                sharding=_sharding_without_layer_axis(x.sharding))


def _map_param_dicts(tree, names: Collection[str], fn):
    """tree with every dict keyed by exactly `names` (the parameters, the optimizer's
    per-parameter moments) replaced by fn(dict)."""
    names = set(names)

    def is_params(x):
        return isinstance(x, dict) and set(x) == names
    return jax.tree.map(lambda x: fn(x) if is_params(x) else x, tree, is_leaf=is_params)


def restore(ckpt, step: int, abstract_params: dict, abstract_opt_state: Any = None):
    """ckpt.restore(step, abstract_params, abstract_opt_state), whatever layout the
    checkpoint was written in: (params, opt_state or None, meta) in the layout, and on
    the shardings, of the abstract targets (jax.ShapeDtypeStruct with shardings)."""
    saved = ckpt.param_shapes(step)
    if layer_stack.is_stacked(saved) == layer_stack.is_stacked(abstract_params):
        return ckpt.restore(step, abstract_params, abstract_opt_state)
    names = list(abstract_params)

    def as_saved(tree):
        return _map_param_dicts(tree, names, lambda d: layer_stack.convert(
            d, saved, stack=_stack_abstract, take=_take_abstract))

    params, opt_state, meta = ckpt.restore(step, as_saved(abstract_params),
                                           as_saved(abstract_opt_state))

    def to_model(params, opt_state):
        back = lambda d: layer_stack.convert_arrays(d, names)
        return back(params), _map_param_dicts(opt_state, saved, back)

    shardings = jax.tree.map(lambda a: a.sharding, (abstract_params, abstract_opt_state))
    params, opt_state = jax.jit(to_model, out_shardings=shardings)(params, opt_state)
    return params, opt_state, meta
