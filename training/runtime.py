"""What train.py runs, set up on the device mesh: the mesh itself, the model described
abstractly with its optimizer and shardings, and the compiled train and eval steps
(training.step's functions, jitted with explicit shardings and donation). The training
loop and eval.speed both build their steps here, so a speed figure is the step a run
takes.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import optax

from kernels import context_parallel
from training import builders, model_state, optim
from training import sharding as shd
from training import step as step_fns


def make_mesh(config):
    """The config's data x fsdp x tensor x sequence mesh; the batch must split evenly
    over it (rows over data x fsdp, each sequence over `sequence`)."""
    mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                         sequence=config.mesh.get("sequence", 1))
    shd.check_batch_divides(config.train.batch_size // config.train.grad_accum, mesh,
                            "train.batch_size / train.grad_accum")
    shd.check_sequence_divides(config.data.seq_len, mesh)
    return mesh


def _on_mesh(fn, mesh):
    """fn traced inside kernels.context_parallel.sequence_mesh(mesh): with a sequence
    axis the mixers split each sequence over it (a no-op without one)."""
    @functools.wraps(fn)
    def traced(*args):
        with context_parallel.sequence_mesh(mesh):
            return fn(*args)
    return traced


class Model(NamedTuple):
    """The model abstractly (no memory, no FLOPs) and its optimizer."""
    make: Callable[[], Any]
    graphdef: Any
    template: Any
    names: dict
    logical: dict
    shapes: dict
    params: dict          # name -> jax.ShapeDtypeStruct
    opt_state: Any        # the optimizer state's tree of jax.ShapeDtypeStruct
    tx: optax.GradientTransformation
    schedule: Callable[[int], Any]
    redraw_every: int     # model.performer_redraw_every: steps per random-feature draw


class Layout(NamedTuple):
    """Where every array lives on the mesh."""
    params: dict          # name -> NamedSharding, by logical-axis rules
    opt_state: Any        # like the parameter it belongs to; counters replicated
    replicated: Any
    batch: Any


def describe_model(config, model_cfg, mesh) -> tuple[Model, Layout]:
    make = builders.model_factory(model_cfg, config.train.seed)
    graphdef, template, _, names, logical, shapes = model_state.describe(make)
    params = {model_state.path_name(p): v.value for p, v in template.flat_state()}
    tx, schedule = optim.make_optimizer(config.train, params, logical)
    opt_state = jax.eval_shape(tx.init, params)
    repl = shd.replicated(mesh)
    param_sh = shd.param_shardings(logical, shapes, mesh)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_state, param_sh,
                                   transform_non_params=lambda _: repl,
                                   is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    model = Model(make, graphdef, template, names, logical, shapes, params, opt_state, tx,
                  schedule, int(model_cfg.performer_redraw_every))
    return model, Layout(param_sh, opt_sh, repl, shd.batch_sharding(mesh))


def init_fresh(model: Model, layout: Layout) -> tuple[dict, Any, Any]:
    """(params, optimizer state, the model's non-parameter state) of a fresh start, each
    placed by its sharding."""
    params, rest = model_state.init_sharded(model.make, layout.params, layout.replicated)
    opt_state = jax.jit(model.tx.init, out_shardings=layout.opt_state)(params)
    return params, opt_state, rest


# One compiled call: the two fold_ins run eagerly dispatch op by op, ~0.35 ms a step on
# a 2-core CPU against ~0.03 ms (inside a traced step it is inlined).
@functools.partial(jax.jit, static_argnames="redraw_every")
def _step_keys(base_key, step, redraw_every: int):
    return (jax.random.fold_in(base_key, step),
            jax.random.fold_in(base_key, step // max(redraw_every, 1)))


class Steps(NamedTuple):
    """The compiled steps and the run's base key: step s trains with
    train(params, opt_state, batch, *keys(s))."""
    train: Callable
    eval: Callable
    base_key: Any
    redraw_every: int = 1

    def keys(self, step: int):
        """Step s's (key, feature key). The key (dropout) is fold_in(base, s). The
        random-feature key is fold_in(base, s // N) for a redraw every N steps, so the
        features change only when s // N does and are a pure function of (seed, layer,
        s // N) (rekey folds in each layer's stream name); resume is exact. N = 1 gives
        the key itself, the features that every-step redraw always drew. The stream
        names keep these apart from dropout's keys of the same index. N = 0 draws none."""
        return _step_keys(self.base_key, step, redraw_every=self.redraw_every)

    def key(self, step: int):
        return self.keys(step)[0]

    def feature_key(self, step: int):
        return self.keys(step)[1]


def compile_steps(model: Model, rest, layout: Layout, t_cfg, mesh,
                  rows: step_fns.Rows) -> Steps:
    """Explicit shardings in and out; the train step donates parameters and optimizer
    state, so a step needs memory for one copy of them. rows: the data's
    (step.Rows.of(dataset)): segment ids only for packed rows, logits only at the loss's
    positions."""
    parts = model_state.ModelParts(model.graphdef, model.template, rest, model.names,
                                   model.logical, model.shapes)
    train_step = jax.jit(_on_mesh(step_fns.make_train_step(parts, model.tx, t_cfg.grad_accum,
                                                           mesh, rows),
                                  mesh),
                         in_shardings=(layout.params, layout.opt_state, layout.batch,
                                       layout.replicated, layout.replicated),
                         out_shardings=(layout.params, layout.opt_state, layout.replicated),
                         donate_argnums=(0, 1))
    eval_step = jax.jit(_on_mesh(step_fns.make_eval_step(parts, rows), mesh),
                        in_shardings=(layout.params, layout.batch),
                        out_shardings=layout.replicated)
    return Steps(train_step, eval_step, jax.random.key(int(t_cfg.seed)), model.redraw_every)
