"""Linearize a trained softmax Transformer (Hedgehog, LoLCATs): attention transfer, then
fine-tuning.

    python -m training.convert --config=configs/convert_hedgehog.py --workdir=DIR \\
        --config.convert.teacher=runs/shakespeare_gpu      # a train.py workdir, or
        --config.convert.teacher=path/to/hf_checkpoint     # config.json + safetensors

The teacher's softmax layers (all, or convert.layers' pattern) become convert.mixer,
initialised from their q/k/v/o projections (training.convert_init). Then, each stage a
run of its own under DIR (config.json, metrics.jsonl, checkpoints/; killed, the same
command resumes it exactly, as train.py does):

  DIR/stage1  attention transfer: only the new parameters train (the rest frozen), on
              convert.loss (attention_ce: Hedgehog's attention-weight cross-entropy;
              output_mse: LoLCATs' output MSE), layer by layer against the frozen
              softmax layer on the same inputs (training.convert_loss); its evaluation is
              the student's next-token loss;
  DIR/stage2  next-token fine-tuning: convert.stage2 "full" (train.py's own train step
              on every parameter) or "lora" (LoRA on the attention projections,
              training.lora, merged at the end), or "none";
  DIR/export  the converted model (models.hf.save: safetensors + our config);
  DIR/report.json  the teacher's eval loss, each stage's, and the per-layer agreement
              (attention overlap and KL, output relative error) before stage 1, after it
              and after stage 2, also printed as a table.

train.* holds what both stages share (batch size, seed, logging, checkpoint intervals);
convert.stage{1,2}_{steps,lr,warmup_steps} their schedules. The steps reuse training.step,
training.runtime's shardings, training.loop's logging, evaluation, saving and signal
handling, and training.checkpoint's verified checkpoints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from training import (builders, checkpoint, config_tools, convert_init, convert_loss, lora,
                      loop, model_state, optim, runtime, workdir_lock)
from training import sharding as shd
from training import step as step_fns

STAGE2 = ("full", "lora", "none")


class ConvertError(config_tools.ConfigError):
    """A conversion that cannot start: a bad teacher, setting or combination."""


# ------------------------------------------------------------------------------ checks
def check_convert(config) -> None:
    """The convert section's values, named, before anything is loaded."""
    from models.config import ModelConfig
    from models.mixers import get_mixer
    c = config.convert
    if not c.get("teacher"):
        raise ConvertError("convert.teacher is required: a train.py workdir (with "
                           "checkpoints/) or a Hugging Face folder (config.json + "
                           "model.safetensors)")
    if c.loss not in convert_loss.LOSSES:
        raise ConvertError(f"convert.loss={c.loss!r}: use one of {convert_loss.LOSSES}")
    try:
        cls = get_mixer(c.mixer)
    except ValueError as e:
        raise ConvertError(f"convert.mixer: {e}") from None
    if c.loss == "attention_ce":
        # the student's settings as far as the config states them (the teacher's fill
        # in the rest later; none of those decides whether weights exist)
        student_keys = {k: v for k, v in config.model.items() if v is not None}
        if not cls.has_attention_weights(ModelConfig(**dict(student_keys, mixer=c.mixer))):
            raise ConvertError(
                f"convert.loss=attention_ce needs normalised feature-map attention "
                f"(hedgehog, hedgehog_window, linear, performer, taylor); {c.mixer!r} has "
                f"no attention weights to compare: use convert.loss=output_mse")
    if c.stage2 not in STAGE2:
        raise ConvertError(f"convert.stage2={c.stage2!r}: use one of {STAGE2}")
    for key in ("stage1_steps", "stage2_steps", "lora_rank", "report_batches"):
        if int(c[key]) < 0 or (key == "lora_rank" and int(c[key]) == 0):
            raise ConvertError(f"convert.{key}={c[key]}: must be "
                               f"{'positive' if key == 'lora_rank' else '>= 0'}")
    if int(c.stage1_steps) + int(c.stage2_steps) == 0:
        raise ConvertError("convert.stage1_steps and convert.stage2_steps are both 0: "
                           "nothing to train")
    if int(config.train.grad_accum) != 1:
        raise ConvertError("the conversion takes train.grad_accum=1")


# ----------------------------------------------------------------------------- teacher
class Teacher(NamedTuple):
    cfg: Any            # ModelConfig, unrolled
    params: dict        # numpy, unrolled names
    data: dict | None   # the data section it was trained on (a workdir), else None
    source: str


def load_teacher(source: str, step: str | None = None) -> Teacher:
    """A train.py workdir (its newest, `best` or numbered checkpoint) or a Hugging Face /
    models.hf folder."""
    from models import hf
    path = pathlib.Path(source)
    if (path / checkpoint.CHECKPOINT_DIR).is_dir():
        want = None if step in (None, "", "latest") else (
            step if step == checkpoint.BEST else int(step))
        model, tconfig, _, at = checkpoint.load_for_eval(path, step=want)
        data = config_tools.to_plain(tconfig)["data"]
        source = f"{path} step {at}"
    elif (path / hf.CONFIG).is_file():
        model, data = hf.load(path), None
    else:
        raise ConvertError(f"convert.teacher={source!r} is neither a train.py workdir "
                           f"(no {path / checkpoint.CHECKPOINT_DIR}) nor a checkpoint "
                           f"folder (no {path / hf.CONFIG})")
    cfg = dataclasses.replace(model.cfg, scan_layers=False)
    return Teacher(cfg, hf.unrolled_params(model), data, source)


# ------------------------------------------------------------------------------ stages
def _stage_config(config, stage: int, model_cfg, data: dict):
    """The run config of one stage: the shared train section with the stage's schedule,
    the student's whole model section, the data section the conversion reads."""
    import ml_collections
    plain = config_tools.to_plain(config)
    c = config.convert
    plain["train"].update(steps=int(c[f"stage{stage}_steps"]), lr=float(c[f"stage{stage}_lr"]),
                          warmup_steps=int(c[f"stage{stage}_warmup_steps"]))
    plain["model"] = model_cfg.to_dict()
    plain["data"] = data
    plain["stage"] = stage
    out = ml_collections.ConfigDict(plain)
    out.lock()
    return out


class _Spec(NamedTuple):
    """One stage as the runner needs it."""
    name: str
    config: Any
    workdir: pathlib.Path
    model_cfg: Any
    params: dict            # every saved name -> jax.ShapeDtypeStruct with its sharding
    opt: Any                # the optimizer state's abstract tree, with shardings
    shapes: dict
    tx: Any
    schedule: Callable
    fresh: Callable         # () -> (params, opt_state), placed
    steps: Callable         # () -> runtime.Steps


def _placed(abstract: dict, shardings: dict) -> dict:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
            for k, v in abstract.items()}


def _optimizer(t_cfg, params: dict, logical: dict, shardings: dict, mesh):
    """(tx, schedule, abstract opt state with shardings) over `params` (abstract)."""
    tx, schedule = optim.make_optimizer(t_cfg, params, logical)
    opt = jax.eval_shape(tx.init, params)
    repl = shd.replicated(mesh)
    sh = optax.tree_map_params(tx, lambda _, s: s, opt, shardings,
                               transform_non_params=lambda _: repl,
                               is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       opt, sh)
    return tx, schedule, opt


def _subset_step(loss_fn, trainable: list[str], tx):
    """An optimizer update of the parameters named `trainable` only, on loss_fn(params,
    batch, rng, feature_rng, aux) -> scalar; the others pass through unchanged. The
    metrics are train.py's (loss, grad_norm over the trained ones, finite)."""
    names = set(trainable)

    def step(params, opt_state, batch, rng, feature_rng, aux):
        fixed = {k: v for k, v in params.items() if k not in names}
        train = {k: params[k] for k in trainable}
        loss, grads = jax.value_and_grad(
            lambda tp: loss_fn({**fixed, **tp}, batch, rng, feature_rng, aux))(train)
        updates, opt_state = tx.update(grads, opt_state, train)
        train = optax.apply_updates(train, updates)
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.all(jnp.stack(
            [jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(train)]))
        return {**fixed, **train}, opt_state, {"loss": loss, "grad_norm": grad_norm,
                                                "finite": finite}
    return step


def _restore(ckpt, spec: _Spec, new_early, is_main: bool):
    """(state, meta) of the newest checkpoint that passes its checks (damaged newer ones
    set aside and named: training.loop.restore_newest); TrainingError if none can be
    read."""
    def read(step):
        ckpt.check_compatible(step, spec.shapes, spec.config.model.to_dict())
        return ckpt.restore(step, spec.params, spec.opt)

    step, (params, opt_state, meta) = loop.restore_newest(ckpt, ckpt.all_steps()[::-1],
                                                          read, is_main)
    return loop._State(params, opt_state, step,
                       new_early(meta.get("early_stop"))), meta


def _run_stage(spec: _Spec, dataset, mesh) -> tuple[dict, dict]:
    """Trains (or resumes, or only re-evaluates a finished) stage: (its final eval
    metrics, its final parameters). training.loop's pieces, in its order."""
    config, t_cfg, workdir = spec.config, spec.config.train, str(spec.workdir)
    is_main = jax.process_index() == 0
    feed = loop._Feed(dataset, t_cfg.batch_size, t_cfg.eval_batches,
                      shd.batch_sharding(mesh))
    with contextlib.ExitStack() as opened:
        ckpt = loop.open_checkpointer(opened, workdir, t_cfg, is_main)
        keep_best = bool(t_cfg.get("keep_best", True))
        new_early = loop.early_stop_rule(t_cfg)
        restored = bool(ckpt.all_steps())
        if restored:
            state, meta = _restore(ckpt, spec, new_early, is_main)
            config_tools.check_resume(meta.get("config"), config, workdir, state.step,
                                      record=is_main)
        else:
            params, opt_state = spec.fresh()
            state = loop._State(params, opt_state, 0, new_early())
        if is_main:
            config_tools.save_config(config, workdir)
        start = state.step
        steps = spec.steps()
        n_params = model_state.num_params(spec.shapes)
        banner = f"{spec.name}: " + loop._banner(n_params, spec.model_cfg, mesh, start, config)
        sinks = loop._open_sinks(opened, config, workdir, start if restored else None,
                                 banner, is_main)
        stop = opened.enter_context(loop._signals_caught())
        saver = loop._Saver(ckpt, config, last_saved=start if restored else None,
                            keep_best=keep_best)
        step_log = loop._StepLog(sinks, loop._Speed(config, spec.model_cfg, n_params, start),
                                 spec.schedule, saver)
        end = start if state.early.stopped else t_cfg.steps
        loop._run_steps(state, end, t_cfg, steps, feed, saver, step_log, sinks, stop)
        step_log.flush(log_now=True)
        result = loop._evaluate(steps.eval, state.params, feed, state.step)
        saver.save(state, eval_loss=result["eval_loss"])
        if state.step > start or not restored:
            sinks.record(result)
        saver.wait()
    return result, state.params


# ----------------------------------------------------------------------------- models
class _Described(NamedTuple):
    parts: model_state.ModelParts
    make: Callable
    abstract: dict      # name -> ShapeDtypeStruct
    logical: dict
    shapes: dict
    shardings: dict


def _describe(model_cfg, seed: int, mesh) -> _Described:
    make = builders.model_factory(model_cfg, seed)
    graphdef, template, _, names, logical, shapes = model_state.describe(make)
    abstract = {model_state.path_name(p): v.value for p, v in template.flat_state()}
    sh = shd.param_shardings(logical, shapes, mesh)
    _, rest = model_state.init_sharded(make, sh, shd.replicated(mesh))
    parts = model_state.ModelParts(graphdef, template, rest, names, logical, shapes)
    return _Described(parts, make, abstract, logical, shapes, sh)


def _put(flat: dict, shardings: dict, dtypes: dict) -> dict:
    return {k: jax.device_put(np.asarray(v, dtypes[k]), shardings[k]) for k, v in flat.items()}


def _report_fn(teacher: _Described, student: _Described, converted, packed, merge):
    def sums(params, tparams, batch):
        t = teacher.parts.merge(tparams)
        s = student.parts.merge(merge(params))
        return convert_loss.agreement(t, s, batch, converted, packed)
    return jax.jit(sums)


def _agreement(fn, params, tparams, feed, batches: int, converted) -> list[dict]:
    total = None
    for j, batch in enumerate(feed.eval()):
        if j >= batches:
            break
        got = jax.device_get(fn(params, tparams, batch))
        total = got if total is None else jax.tree.map(np.add, total, got)
    return convert_loss.summarise(total, converted)


def print_agreement(title: str, rows: list[dict]) -> None:
    fmt = lambda v: "   -  " if v is None else f"{v:6.3f}"
    lines = [f"{title}", "layer  attn_overlap  attn_kl  out_rel_err  out_cos"]
    lines += [f"{r['layer']:5d}  {fmt(r['attn_overlap']):>12s}  {fmt(r['attn_kl']):>7s}  "
              f"{fmt(r['out_rel_err']):>11s}  {fmt(r['out_cos']):>7s}" for r in rows]
    print("\n".join(lines), file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------- run
def run(config, workdir: str) -> dict:
    """The whole conversion in `workdir` (resumable); returns the report."""
    check_convert(config)
    with jax.default_prng_impl(config_tools.prng_impl(config)):
        try:
            return _run(config, pathlib.Path(workdir))
        except (checkpoint.CheckpointSaveFailed, workdir_lock.WorkdirLocked) as e:
            raise loop.TrainingError(str(e)) from e


def _run(config, workdir: pathlib.Path) -> dict:
    from models import hf
    c = config.convert
    teacher = load_teacher(c.teacher, c.get("teacher_step"))
    data = (teacher.data if c.get("data_from_teacher", True) and teacher.data is not None
            else config_tools.to_plain(config)["data"])
    dtype = config_tools.compute_dtype(config.train.get("precision") or "float32")
    tcfg = dataclasses.replace(teacher.cfg, dtype=dtype, dropout=0.0)
    # The model section holds only the student's own keys; None keeps the teacher's.
    overrides = {k: v for k, v in config.model.to_dict().items() if v is not None}
    try:
        scfg, converted = convert_init.student_config(tcfg, c.mixer, c.layers, overrides)
    except ValueError as e:
        raise ConvertError(str(e)) from None
    # Stage 1 matches the frozen teacher layer by layer, so both run without dropout.
    # Stage 2 trains on next-token loss as the teacher was trained, with its dropout
    # (model.dropout sets another): without it, fine-tuning a small-data teacher
    # memorises the training text and its validation loss rises.
    tune_cfg = dataclasses.replace(scfg, dtype=dtype,
                                   dropout=overrides.get("dropout", teacher.cfg.dropout))
    scfg = dataclasses.replace(scfg, dtype=dtype, dropout=0.0)
    stage_cfgs = {1: _stage_config(config, 1, scfg, data),
                  2: _stage_config(config, 2, tune_cfg, data)}
    active = {1: int(c.stage1_steps) > 0,
              2: c.stage2 != "none" and int(c.stage2_steps) > 0}
    for s, stage_cfg in stage_cfgs.items():
        if active[s]:
            config_tools.check_config(stage_cfg)
    dataset = builders.build_dataset(stage_cfgs[1])
    if dataset.vocab_size > tcfg.vocab_size:
        raise ConvertError(f"the data's vocabulary ({dataset.vocab_size}) is larger than the "
                           f"teacher's ({tcfg.vocab_size}): convert on the data the teacher "
                           f"was trained on (convert.data_from_teacher=True) or its "
                           f"tokenizer")
    mesh = runtime.make_mesh(stage_cfgs[1])
    seed = int(config.train.seed)
    packed = dataset.packed
    T = _describe(tcfg, seed, mesh)
    S = _describe(scfg, seed, mesh)
    S_tune = S if tune_cfg == scfg else _describe(tune_cfg, seed, mesh)
    tparams = _put(teacher.params, T.shardings, {k: v.dtype for k, v in T.abstract.items()})
    repl = shd.replicated(mesh)
    feed = loop._Feed(dataset, config.train.batch_size, config.train.eval_batches,
                      shd.batch_sharding(mesh))
    report = {"teacher": teacher.source, "mixer": c.mixer, "loss": c.loss,
              "converted_layers": converted, "student_layers": scfg.layer_mixers()}
    teacher_eval = jax.jit(step_fns.make_eval_step(T.parts, step_fns.Rows(packed)))
    report["teacher_eval"] = loop._evaluate(teacher_eval, tparams, feed, 0)
    batches = int(c.report_batches)

    # --- stage 1: attention transfer on the new parameters.
    student_init = {k: np.asarray(v) for k, v in jax.device_get(
        model_state.init_sharded(S.make, S.shardings, repl)[0]).items()}
    try:
        first, trainable = convert_init.student_params(
            teacher.params, tcfg, student_init, scfg, converted, c.get("stage1_params", ""))
    except ValueError as e:
        raise ConvertError(str(e)) from None
    trainable = sorted(trainable)
    report["stage1_trainable"] = trainable
    dtypes = {k: v.dtype for k, v in S.abstract.items()}
    agree = _report_fn(T, S, converted, packed, lambda p: p)
    params = _put(first, S.shardings, dtypes)
    report["agreement_init"] = _agreement(agree, params, tparams, feed, batches, converted)
    print_agreement("agreement at init (the teacher's projections)", report["agreement_init"])
    if active[1]:
        params, result = _stage1(stage_cfgs[1], workdir / "stage1", S, T, first, trainable,
                                 converted, packed, tparams, dataset, mesh)
        report["stage1_eval"] = result
        report["agreement_stage1"] = _agreement(agree, params, tparams, feed, batches,
                                                converted)
        print_agreement("agreement after stage 1", report["agreement_stage1"])

    # --- stage 2: next-token fine-tuning.
    scale = float(c.lora_alpha) / int(c.lora_rank)
    merge = lambda p: p
    if active[2]:
        host = {k: np.asarray(v) for k, v in jax.device_get(params).items()}
        params, result, merge = _stage2(stage_cfgs[2], workdir / "stage2", S_tune, host, c,
                                        trainable, scale, dataset, mesh, packed)
        report["stage2_eval"] = result
        agree2 = _report_fn(T, S, converted, packed, merge)
        report["agreement_stage2"] = _agreement(agree2, params, tparams, feed, batches,
                                                converted)
        print_agreement("agreement after stage 2", report["agreement_stage2"])
    final = {k: np.asarray(v) for k, v in jax.device_get(merge(params)).items()}
    if c.get("export", True) and jax.process_index() == 0:
        report["export"] = str(workdir / "export")
        report["export_format"] = hf.save(hf.build(tune_cfg, final), workdir / "export")
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _stage1(config, workdir, S: _Described, T: _Described, first: dict, trainable: list,
            converted, packed, tparams, dataset, mesh):
    kind = config.convert.loss
    sub = {k: S.abstract[k] for k in trainable}
    tx, schedule, opt = _optimizer(config.train, sub, S.logical,
                                   {k: S.shardings[k] for k in trainable}, mesh)
    dtypes = {k: v.dtype for k, v in S.abstract.items()}
    t_sh = T.shardings

    def loss_fn(params, batch, rng, feature_rng, tp):
        teacher = T.parts.merge(tp)
        student = S.parts.merge(params)
        return convert_loss.transfer_loss(kind, teacher, student, batch, converted,
                                          packed)[0]

    def fresh():
        params = _put(first, S.shardings, dtypes)
        opt_state = jax.jit(tx.init, out_shardings=jax.tree.map(lambda a: a.sharding, opt))(
            {k: params[k] for k in trainable})
        return params, opt_state

    def steps():
        repl = shd.replicated(mesh)
        opt_sh = jax.tree.map(lambda a: a.sharding, opt)
        train = jax.jit(_subset_step(loss_fn, trainable, tx),
                        in_shardings=(S.shardings, opt_sh, shd.batch_sharding(mesh), repl,
                                      repl, t_sh),
                        out_shardings=(S.shardings, opt_sh, repl), donate_argnums=(0, 1))
        ev = jax.jit(step_fns.make_eval_step(S.parts, step_fns.Rows(packed)))
        return runtime.Steps(lambda p, o, b, r, f: train(p, o, b, r, f, tparams), ev,
                             jax.random.key(int(config.train.seed)),
                             int(config.model.performer_redraw_every))

    spec = _Spec("stage 1 (attention transfer)", config, workdir, _cfg(config), _placed(
        S.abstract, S.shardings), opt, S.shapes, tx, schedule, fresh, steps)
    result, params = _run_stage(spec, dataset, mesh)
    return params, result


def _cfg(config):
    from models import ModelConfig
    return ModelConfig.from_dict(config.model.to_dict())


def _stage2(config, workdir, S: _Described, start: dict, c, stage1_trainable, scale,
            dataset, mesh, packed):
    """(final params, eval result, merge) of the fine-tuning stage."""
    t_cfg = config.train
    dtypes = {k: v.dtype for k, v in S.abstract.items()}
    repl = shd.replicated(mesh)
    if c.stage2 == "full":  # train.py's own step on every parameter
        model = runtime.Model(S.make, S.parts.graphdef, S.parts.param_template,
                              S.parts.names, S.logical, S.shapes, S.abstract, None, None,
                              None, int(config.model.performer_redraw_every))
        tx, schedule, opt = _optimizer(t_cfg, S.abstract, S.logical, S.shardings, mesh)
        model = model._replace(opt_state=opt, tx=tx, schedule=schedule)
        layout = runtime.Layout(S.shardings, jax.tree.map(lambda a: a.sharding, opt), repl,
                                shd.batch_sharding(mesh))

        def fresh():
            params = _put(start, S.shardings, dtypes)
            return params, jax.jit(tx.init, out_shardings=layout.opt_state)(params)

        spec = _Spec("stage 2 (fine-tuning, all parameters)", config, workdir, _cfg(config),
                     _placed(S.abstract, S.shardings), opt, S.shapes, tx, schedule, fresh,
                     lambda: runtime.compile_steps(model, S.parts.rest, layout, t_cfg, mesh,
                                                   step_fns.Rows(packed)))
        result, params = _run_stage(spec, dataset, mesh)
        return params, result, lambda p: p

    kernels = lora.targets(S.abstract, c.lora_targets.split(","))
    if not kernels:
        raise ConvertError(f"convert.lora_targets={c.lora_targets!r} matches no kernel of "
                           f"the student's mixers")
    rank = int(c.lora_rank)
    adapters = jax.eval_shape(lambda: lora.init(S.abstract, kernels, rank,
                                                jax.random.key(0)))
    logical = dict(S.logical)
    for k in kernels:
        axes = tuple(S.logical.get(k) or (None, None))
        logical[f"{lora.PREFIX}{k}/a"] = (axes[0], None)
        logical[f"{lora.PREFIX}{k}/b"] = (None, axes[-1])
    shapes = {**S.shapes, **{k: tuple(v.shape) for k, v in adapters.items()}}
    abstract = {**S.abstract, **adapters}
    shardings = {**S.shardings, **shd.param_shardings(
        {k: logical[k] for k in adapters}, {k: shapes[k] for k in adapters}, mesh)}
    trainable = sorted(adapters) + (sorted(stage1_trainable)
                                    if c.get("stage2_train_new", False) else [])
    tx, schedule, opt = _optimizer(t_cfg, {k: abstract[k] for k in trainable}, logical,
                                   {k: shardings[k] for k in trainable}, mesh)
    merge = lambda p: lora.merge(p, scale)

    def loss_fn(params, batch, rng, feature_rng, _):
        rest = model_state.rekey(S.parts.rest, rng, feature_rng)
        s, n, _c = step_fns.loss_sums(S.parts.merge(merge(params), rest), batch,
                                      deterministic=False, packed=packed)
        return s / jnp.maximum(n, 1.0)

    def fresh():
        base = _put(start, S.shardings, dtypes)
        key = jax.random.fold_in(jax.random.key(int(t_cfg.seed)), 0x10A)
        ad = jax.jit(lambda: lora.init(S.abstract, kernels, rank, key),
                     out_shardings={k: shardings[k] for k in adapters})()
        params = {**base, **ad}
        opt_state = jax.jit(tx.init, out_shardings=jax.tree.map(lambda a: a.sharding, opt))(
            {k: params[k] for k in trainable})
        return params, opt_state

    def steps():
        opt_sh = jax.tree.map(lambda a: a.sharding, opt)
        train = jax.jit(_subset_step(loss_fn, trainable, tx),
                        in_shardings=(shardings, opt_sh, shd.batch_sharding(mesh), repl,
                                      repl, None),
                        out_shardings=(shardings, opt_sh, repl), donate_argnums=(0, 1))
        ev_inner = step_fns.make_eval_step(S.parts, step_fns.Rows(packed))
        ev = jax.jit(lambda p, b: ev_inner(merge(p), b))
        return runtime.Steps(lambda p, o, b, r, f: train(p, o, b, r, f, None), ev,
                             jax.random.key(int(t_cfg.seed)),
                             int(config.model.performer_redraw_every))

    spec = _Spec(f"stage 2 (LoRA rank {rank} on {len(kernels)} projections)", config,
                 workdir, _cfg(config), _placed(abstract, shardings), opt, shapes, tx,
                 schedule, fresh, steps)
    result, params = _run_stage(spec, dataset, mesh)
    return params, result, merge


# -------------------------------------------------------------------------------- CLI
def main(argv=None) -> None:
    argv = sys.argv if argv is None else argv
    path, overrides = config_tools.overrides_from_argv(argv[1:])
    if path is None:
        sys.exit("error: --config is required, e.g. --config=configs/convert_hedgehog.py")
    workdir = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--workdir=")), None)
    if workdir is None and "--workdir" in argv:
        workdir = argv[argv.index("--workdir") + 1]
    if not workdir:
        sys.exit("error: --workdir is required, e.g. --workdir=runs/convert")
    try:
        config = config_tools.load_config_file(path)
        config_tools.check_overrides(config, overrides)
        config.unlock()
        for key, text in overrides.items():
            _set(config, key, text)
        config.lock()
    except config_tools.ConfigError as e:
        sys.exit(f"error: {e}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    with loop.command_errors(FileNotFoundError):
        report = run(config, workdir)
    summary = {k: report[k]["eval_loss"] for k in ("teacher_eval", "stage1_eval",
                                                   "stage2_eval") if k in report}
    print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in summary.items()), flush=True)


def _set(config, dotted: str, text: str) -> None:
    """--config.KEY=VALUE parsed by the field's declared type (config_tools.parse_value)."""
    field_type, _ = config_tools._field_type(config, dotted)
    config_tools.set_values(config, {dotted: config_tools.parse_value(text, field_type)})


if __name__ == "__main__":
    main()
