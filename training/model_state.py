"""NNX model <-> the pure arrays that training jits over.

`nnx.split(model, nnx.Param, ...)` gives (graphdef, params, rest). Training keeps params as
a flat dict {"blocks/0/mixer/q_proj/kernel": array} ("scan_blocks/0/..." stacked by layer
when scan_layers; models.layer_stack): easy to shard by name, to mask for weight decay, to
checkpoint, and to compare against a checkpoint with readable names.
`rest` holds non-trainable state, chiefly the RNG streams of dropout (and random-feature
maps). It is not carried from step to step: each step re-keys its RNG streams from
(seed, step), and the random-feature streams from (seed, step // N), so dropout and the
features are pure functions of the step and resume is exact without saving RNG counters.
"""
from __future__ import annotations

import contextlib
import dataclasses
import zlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from models import layer_stack

# Names the partitioning metadata goes by across flax 0.12.x.
_SHARDING_METADATA = ("out_sharding", "sharding_names", "sharding")


def path_name(path) -> str:
    return "/".join(str(getattr(p, "key", p)) for p in path)


def logical_axes(variable) -> tuple | None:
    meta = variable.get_metadata() if hasattr(variable, "get_metadata") else {}
    for key in _SHARDING_METADATA:
        names = meta.get(key)
        if names:
            return tuple(names)
    return None


@dataclasses.dataclass
class ModelParts:
    """What stays fixed while training: how to rebuild the model around new arrays."""
    graphdef: Any
    param_template: nnx.State      # abstract; its Variables carry the metadata
    rest: nnx.State                 # non-param state (RNG streams), concrete
    names: dict[str, tuple]         # flat name -> state path
    logical: dict[str, tuple | None]
    shapes: dict[str, tuple]

    def merge(self, params: dict, rest=None):
        """An nnx model whose parameters are `params` (a flat dict)."""
        state = nnx.State.from_flat_path(
            [(path, self.param_template_flat[name].replace(params[name]))
             for name, path in self.names.items()])
        rest = self.rest if rest is None else rest
        # Re-create every Variable in the current trace (a pytree round trip): NNX refuses
        # to mutate (RNG counters, remat write-back) Variables made at another trace level.
        state, rest = jax.tree.map(lambda x: x, (state, rest))
        return nnx.merge(self.graphdef, state, rest)

    @property
    def param_template_flat(self):
        if not hasattr(self, "_flat"):
            self._flat = {path_name(p): v for p, v in self.param_template.flat_state()}
        return self._flat


def flat_params(params_state: nnx.State) -> dict:
    return {path_name(p): (v.value if hasattr(v, "value") else v)
            for p, v in params_state.flat_state()}


def describe(make_model: Callable[[], nnx.Module]):
    """Abstract (shape-only) split of a model: no memory, no FLOPs."""
    with nnx.use_eager_sharding(False):
        abstract = nnx.eval_shape(make_model)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    flat = list(params.flat_state())
    names = {path_name(p): tuple(p) for p, _ in flat}
    logical = {path_name(p): logical_axes(v) for p, v in flat}
    shapes = {path_name(p): tuple(v.value.shape) for p, v in flat}
    return graphdef, params, rest, names, logical, shapes


def init_sharded(make_model: Callable[[], nnx.Module], param_shardings: dict,
                 rest_sharding):
    """Builds the model inside one jit so each device creates only its own shards."""
    return seeded_init(lambda _seed: make_model(), param_shardings, rest_sharding)(0)


def seeded_init(make_of_seed: Callable[[Any], nnx.Module], param_shardings: dict,
                rest_sharding) -> Callable[[int], tuple[dict, nnx.State]]:
    """init(seed) -> (flat params, rest) of make_of_seed(seed), built inside one jit so
    each device creates only its own shards, from one program compiled once for every
    seed (the seed is its int32 argument)."""
    def init(seed):
        with nnx.use_eager_sharding(False):
            model = make_of_seed(seed)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        return flat_params(params), rest

    _, _, abstract_rest, *_ = describe(lambda: make_of_seed(0))
    rest_shardings = jax.tree.map(lambda _: rest_sharding, abstract_rest)
    compiled = jax.jit(init, out_shardings=(param_shardings, rest_shardings))

    def init_of_seed(seed):
        with threefry_as_gpu_kernel():  # jit lowers at the call
            return compiled(jnp.asarray(seed, jnp.int32))
    return init_of_seed


@contextlib.contextmanager
def threefry_as_gpu_kernel():
    """Lowers the threefry hash to jax's one-call GPU kernel (the same bits) instead of
    its unrolled XLA form, within this context. A model's init draws every parameter
    through the hash, and on the GPU each draw's unrolled form is a program for XLA to
    compile: an 8-layer d1024 model's init took longer to compile than its train step
    (docs/benchmarks.md). No effect off the GPU."""
    flag = "jax_threefry_gpu_kernel_lowering"
    previous = getattr(jax.config, flag)
    jax.config.update(flag, True)
    try:
        yield
    finally:
        jax.config.update(flag, previous)


# The attribute under which a mixer keeps the RNG stream it redraws random features from
# (models.mixers.linear.Performer.feature_rngs). Its streams take rekey's feature_key, so
# the features can change on their own schedule (every N steps), apart from dropout.
FEATURE_STREAM = "feature_rngs"


def rekey(rest: nnx.State, key, feature_key=None) -> nnx.State:
    """A copy of `rest` whose RNG streams are keyed from `key` (one per stream, by path),
    and the random-feature streams (FEATURE_STREAM) from `feature_key` (default `key`).

    A scanned model's layer streams are stacked ("scan_blocks/j/...", one key per
    repeat): repeat r gets the key of the unrolled model's stream of the same layer
    ("blocks/{r * period + j}/..."), so dropout and features do not depend on scan_layers
    and a run may resume in the other layout with the same masks."""
    flat = list(rest.flat_state())
    period = layer_stack.stacked_period([path_name(p) for p, _ in flat])
    feature_key = key if feature_key is None else feature_key

    def keyed(path, name):
        is_feature = FEATURE_STREAM in path_name(path).split("/")
        base = feature_key if is_feature else key
        return jax.random.fold_in(base, zlib.crc32(name.encode()) & 0x7FFFFFFF)

    def fix(path, variable):
        if isinstance(variable, nnx.RngKey):
            name = path_name(path)
            shape = variable.get_value().shape
            if not shape:
                return variable.replace(keyed(path, name))
            return variable.replace(jnp.stack(
                [keyed(path, layer_stack.unrolled_name(name, r, period))
                 for r in range(shape[0])]))
        if isinstance(variable, nnx.RngCount):
            return variable.replace(jnp.zeros_like(variable.value))
        return variable

    return nnx.State.from_flat_path([(p, fix(p, v)) for p, v in flat])


def num_params(shapes: dict) -> int:
    total = 0
    for s in shapes.values():
        n = 1
        for d in s:
            n *= d
        total += n
    return total
