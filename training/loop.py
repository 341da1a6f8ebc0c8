"""The training loop: config -> data -> mesh -> model + optimizer -> steps, evals and
checkpoints.

`train()` does what train.py promises, and `_train` reads as that list:
  1. build the dataset, the model config (vocab from the dataset) and the device mesh;
  2. describe the model abstractly and shard its parameters by logical-axis rules;
  3. restore the newest complete checkpoint if the workdir has one (after checking it
     fits the model), else initialise inside one sharded jit;
  4. run one jitted, donated train step per batch; the batch at step s is
     dataset.batch(s), so the data position is the step and resume is exact;
  5. log, evaluate, checkpoint; stop cleanly on NaN (no save), on early stopping (save)
     or on SIGINT/SIGTERM (save).
The mesh, the model's description and the compiled steps are training.runtime's (shared
with eval.speed, which times the same step); the pieces here follow `_train` in the order
it calls them: data, restore, evaluation, logging, saving, signals, the loop.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import sys
import time
from typing import Any, Callable, Iterator, NamedTuple

import jax
import numpy as np

from training import (builders, checkpoint, config_tools, flops, metrics, model_state,
                      param_layout, runtime, workdir_lock, workdir_tokenizer)
from training import sharding as shd
from training import step as step_fns


class TrainingError(RuntimeError):
    """A run that must stop: non-finite loss and the like. The message says what to do."""


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a checkpoint at `step` was written."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step


@contextlib.contextmanager
def command_errors(*extra: type[Exception], saved: str = "checkpoint saved"):
    """For a training command's main: a stop by SIGINT/SIGTERM (Interrupted) says what
    was saved and how to resume, and exits with 128 + the signal's number, as a shell
    reports a killed process; a bad config, mesh or checkpoint, a failed run, or one of
    `extra`, exits with its one-line message (no traceback: the message names the fix)."""
    try:
        yield
    except Interrupted as e:
        print(f"{e}; {saved}. Run the same command to resume.", file=sys.stderr)
        sys.exit(128 + e.signum)
    except (config_tools.ConfigError, shd.MeshError, checkpoint.CheckpointMismatch,
            TrainingError, *extra) as e:
        sys.exit(f"error: {e}")


def train(config, workdir: str) -> dict[str, Any]:
    """Trains (or resumes) the run in `workdir`; returns the final eval metrics (and
    `best_step`, the kept checkpoint with the lowest eval loss)."""
    config_tools.check_config(config)
    # Every key of the run (init, dropout) comes from this generator; scoped to the run.
    with jax.default_prng_impl(config_tools.prng_impl(config)):
        try:
            return _train(config, workdir)
        except (checkpoint.CheckpointSaveFailed, workdir_lock.WorkdirLocked,
                workdir_tokenizer.TokenizerMismatch) as e:
            # One line for train.py, which reports TrainingError; nothing is retried.
            raise TrainingError(str(e)) from e


def open_checkpointer(opened: contextlib.ExitStack, workdir: str, t_cfg,
                      is_main: bool) -> checkpoint.Checkpointer:
    """The run's checkpointer, entered into `opened` (closing it waits for an async save
    in flight), after the workdir's lock on the main process (taken before anything is
    written: a second run on the workdir stops there) and with orbax's per-save records
    hidden."""
    if is_main:
        opened.enter_context(workdir_lock.held(workdir))
    opened.enter_context(checkpoint.orbax_records_hidden())
    return opened.enter_context(contextlib.closing(checkpoint.Checkpointer(
        workdir, keep=t_cfg.keep_checkpoints, async_save=t_cfg.async_checkpoints,
        keep_best=bool(t_cfg.get("keep_best", True)))))


def _train(config, workdir: str) -> dict[str, Any]:
    t_cfg = config.train
    is_main = jax.process_index() == 0
    dataset, model_cfg = _dataset_and_model_config(config)
    mesh = runtime.make_mesh(config)
    model, layout = runtime.describe_model(config, model_cfg, mesh)
    feed = _Feed(dataset, t_cfg.batch_size, t_cfg.eval_batches, layout.batch)

    # Everything opened below is closed on the way out, whatever stops the run; closing
    # the checkpointer waits for an async save in flight.
    with contextlib.ExitStack() as opened:
        ckpt = open_checkpointer(opened, workdir, t_cfg, is_main)
        keep_best = bool(t_cfg.get("keep_best", True))
        new_early = early_stop_rule(t_cfg)
        # A checkpoint of another model, or a resume with changed settings, stops here,
        # before config.json or metrics.jsonl change.
        state, rest, meta = _restore_or_init(ckpt, model, layout, new_early,
                                             config.model.to_dict(), is_main)
        restored = meta is not None
        if restored:
            config_tools.check_resume(meta.get("config"), config, workdir, state.step,
                                      record=is_main)
        # The tokenizer travels with the run (eval and generate read it); a resume on
        # data whose tokenizer differs stops here.
        workdir_tokenizer.check_or_save(workdir, dataset.tokenizer, resuming=restored,
                                        cfg_data=config.data, write=is_main)
        if is_main:
            config_tools.save_config(config, workdir)
        start = state.step
        steps = runtime.compile_steps(model, rest, layout, t_cfg, mesh,
                                      step_fns.Rows.of(dataset))

        n_params = model_state.num_params(model.shapes)
        banner = _banner(n_params, model_cfg, mesh, start, config)
        sinks = _open_sinks(opened, config, workdir, start if restored else None, banner,
                            is_main)
        stop = opened.enter_context(_signals_caught())

        saver = _Saver(ckpt, config, last_saved=start if restored else None,
                       keep_best=keep_best)
        step_log = _StepLog(sinks, _Speed(config, model_cfg, n_params, start),
                            model.schedule, saver)
        end_step = start if state.early.stopped else t_cfg.steps
        _run_steps(state, end_step, t_cfg, steps, feed, saver, step_log, sinks, stop)

        step_log.flush(log_now=True)
        # A finished run started again only re-reports: its final eval is already logged.
        result = _evaluate(steps.eval, state.params, feed, state.step)
        saver.save(state, eval_loss=result["eval_loss"])  # ranked for the kept best
        if state.step > start or not restored:
            sinks.record(result)
        saver.wait()
        result["best_step"] = ckpt.best_step() if keep_best else None
    result["num_params"] = n_params
    result["step"] = state.step
    return result


# ------------------------------------------------------------------------------------ data
def _dataset_and_model_config(config):
    try:
        dataset = builders.build_dataset(config)
    except (ValueError, OSError, KeyError, ImportError) as e:
        # The data package's message names the file; "data:" names the config section.
        raise config_tools.ConfigError(f"data: {e.args[0] if e.args else e}") from e
    return dataset, builders.build_model_config(config, dataset)


class _Feed(NamedTuple):
    """Global batches on the mesh. The training batch of step s is dataset.batch(s): the
    data position is the step, so a resumed run sees the batches an uninterrupted one
    would. Each process reads only its rows of it (dataset.batch_rows, the rows its
    devices hold) and the global array is assembled from every process's share
    (jax.make_array_from_process_local_data); one process reads them all."""
    dataset: Any
    batch_size: int
    eval_batches: int
    sharding: Any

    def train(self, step: int) -> dict:
        shape = (self.batch_size, int(self.dataset.seq_len))
        if jax.process_count() == 1:   # every row: dataset.batch itself, so a wrapper of
            # the dataset that overrides batch() (a test's fault, a user's filter) is used
            local = self.dataset.batch(step, self.batch_size)
        else:
            rows = shd.process_rows(self.sharding, shape)
            local = self.dataset.batch_rows(step, self.batch_size, rows)
        return shd.global_batch_from_process_data(local, self.sharding, shape)

    def eval(self) -> Iterator[dict]:
        # The held-out batches are few and walked in order: each process reads them whole
        # and keeps its rows.
        shape = (self.batch_size, int(self.dataset.seq_len))
        rows = None if jax.process_count() == 1 else shd.process_rows(self.sharding, shape)
        for b in self.dataset.eval_batches(self.batch_size, self.eval_batches):
            local = b if rows is None else {k: v[rows] for k, v in b.items()}
            yield shd.global_batch_from_process_data(local, self.sharding, shape)


# ---------------------------------------------------------------------------------- restore
class _EarlyStop:
    """Early stopping: stops once `limit` evaluations in a row bring no new best eval loss
    (limit 0: never), or once the eval accuracy exceeds `accuracy` (0: never; Zoology's
    early_stopping_threshold on valid/accuracy, 0.99 in its MQAR runs). The best
    validation loss a run reports is unchanged by stopping. Its state travels in the
    checkpoint, so a resumed run stops where an uninterrupted one would, and a run that
    stopped early stays stopped."""

    def __init__(self, limit: int, saved: dict | None = None, accuracy: float = 0.0):
        saved = saved or {}
        self.limit, self.accuracy = limit, float(accuracy)
        self.best = math.inf if saved.get("best") is None else float(saved["best"])
        self.best_step = saved.get("best_step")
        self.since_best = int(saved.get("since_best", 0))
        self.stopped = bool(saved.get("stopped"))
        # Checkpoints from before the reason was recorded: stopped by patience.
        self.reason = saved.get("reason") or ("no new best eval_loss" if self.stopped
                                              else None)

    def update(self, eval_loss: float, step: int | None = None,
               eval_accuracy: float | None = None) -> bool:
        """Counts one evaluation (of the parameters after `step` updates); True when the
        run is to stop now (self.reason says why)."""
        if eval_loss < self.best:
            self.best, self.since_best, self.best_step = eval_loss, 0, step
        else:
            self.since_best += 1
        if self.accuracy > 0 and eval_accuracy is not None and eval_accuracy > self.accuracy:
            self.reason = (f"eval_accuracy {eval_accuracy:.4f} > {self.accuracy} "
                           f"(train.early_stop_accuracy)")
        elif self.limit > 0 and self.since_best >= self.limit:
            self.reason = (f"no new best eval_loss in {self.limit} evaluations (best "
                           f"{self.best:.4f} at step {self.best_step})")
        self.stopped = self.reason is not None
        return self.stopped

    def saved(self) -> dict:
        return {"best": None if math.isinf(self.best) else self.best,
                "best_step": self.best_step, "since_best": self.since_best,
                "stopped": self.stopped, "reason": self.reason}


def early_stop_rule(t_cfg) -> Callable[..., _EarlyStop]:
    """new(saved=None): a run's early stopping as the train section sets it
    (early_stop_patience, early_stop_accuracy), fresh or from a checkpoint's record."""
    limit = int(t_cfg.get("early_stop_patience", 0) or 0)
    accuracy = float(t_cfg.get("early_stop_accuracy", 0.0) or 0.0)
    return lambda saved=None: _EarlyStop(limit, saved, accuracy)


@dataclasses.dataclass
class _State:
    """What a checkpoint holds: the arrays, the updates done so far, early stopping."""
    params: dict
    opt_state: Any
    step: int
    early: _EarlyStop


def _restore_or_init(ckpt, model: runtime.Model, layout: runtime.Layout, new_early,
                     model_section: dict, is_main: bool) -> tuple[_State, Any, dict | None]:
    """(the state to start from, the model's non-parameter state, the restored step's
    meta or None for a fresh start). The model is always initialised: its RNG streams
    are not in the checkpoint (each step re-keys them).

    The newest step that passes its checks is restored; newer damaged ones are named
    (one line each) and set aside once a good one is found, so that the run's next
    saves do not meet them. A checkpoint of another model is not damage: it stops the
    run (CheckpointMismatch). If every step is damaged, nothing is moved and the run
    stops, since starting fresh would throw the workdir's history away."""
    candidates = ckpt.all_steps()[::-1]
    if not candidates:
        params, opt_state, rest = runtime.init_fresh(model, layout)
        return _State(params, opt_state, 0, new_early()), rest, None
    params, rest = model_state.init_sharded(model.make, layout.params, layout.replicated)
    del params  # freed before the checkpoint's arrays take their place

    def read(step):
        ckpt.check_compatible(step, model.shapes, model_section)
        # In the checkpoint's layout, converted if scan_layers changed (param_layout).
        return param_layout.restore(ckpt, step, _placed(model.params, layout.params),
                                    _placed(model.opt_state, layout.opt_state))

    step, (params, opt_state, meta) = restore_newest(ckpt, candidates, read, is_main)
    if int(meta.get("data_position", step)) != step:
        raise TrainingError(f"checkpoint {step} has data position {meta['data_position']}")
    early = new_early(meta.get("early_stop"))
    return _State(params, opt_state, step, early), rest, meta


def restore_newest(ckpt, steps, read, is_main: bool):
    """(step, read(step)) for the first of `steps` (newest first) whose read passes its
    checks; read raises checkpoint.CheckpointDamaged for a damaged step. Newer damaged
    steps are named (one line each) and set aside once a good one is found, so that the
    run's next saves do not meet them; if every step is damaged nothing is moved and
    TrainingError names them all."""
    damaged = []
    for step in steps:
        try:
            # Orbax's warnings about a damaged step's files: it is named below instead.
            with checkpoint.orbax_records_hidden(logging.WARNING):
                restored = read(step)
        except checkpoint.CheckpointDamaged as e:
            damaged.append(e)
            continue
        for e in damaged:
            moved = ckpt.set_aside(e.step)
            if is_main:
                print(f"{e}; moved to {moved}; resuming from step {step}", file=sys.stderr,
                      flush=True)
        return step, restored
    raise TrainingError(
        f"no checkpoint in {ckpt.directory} can be read: "
        + "; ".join(f"step {e.step}: {e.reason}" for e in damaged)
        + ". Nothing was changed; move the damaged steps away to start fresh, or use "
          "another --workdir.")


def _placed(abstract, shardings):
    """Abstract arrays that carry their target shardings (what a restore fills in)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


# ------------------------------------------------------------------------------- evaluation
def _evaluate(eval_step, params, feed: _Feed, step: int) -> dict:
    """Masked loss and accuracy over the eval batches, token-weighted."""
    total = np.zeros(3)
    for batch in feed.eval():
        total += np.asarray(jax.device_get(eval_step(params, batch)))
    return {"step": step, "eval_loss": total[0] / max(total[1], 1.0),
            "eval_accuracy": total[2] / max(total[1], 1.0)}


# ---------------------------------------------------------------------------------- logging
def _banner(n_params: int, model_cfg, mesh, start: int, config) -> str:
    where = f"resuming from step {start}" if start else "starting fresh"
    peak = flops.run_peak(config.train.peak_flops, model_cfg.dtype)
    return (f"{n_params:,} parameters; mixers {model_cfg.layer_mixers()}; mesh "
            f"{dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} "
            f"device(s){flops.peak_note(peak)}; {where}")


def _open_sinks(opened: contextlib.ExitStack, config, workdir: str, resume_step: int | None,
                banner: str, is_main: bool) -> metrics.Sinks:
    """metrics.jsonl (its entries past `resume_step` dropped), wandb and the terminal,
    each closed by `opened`. Only the main process writes them; the banner comes before
    the progress bar starts drawing."""
    log = opened.enter_context(contextlib.closing(metrics.MetricsFile(
        workdir, resume_step=resume_step, enabled=is_main)))
    wandb = opened.enter_context(contextlib.closing(metrics.WandbLogger(
        workdir, mode=config.logging.wandb, project=config.logging.project,
        name=config.logging.name, config=config_tools.to_plain(config), enabled=is_main)))
    if is_main:
        print(banner, file=sys.stderr, flush=True)
    progress = opened.enter_context(contextlib.closing(metrics.Progress(
        config.logging.progress and is_main, resume_step or 0, config.train.steps)))
    return metrics.Sinks(log, wandb, progress)


class _Speed:
    """Tokens per second over the steps since the clock last started, and the MFU."""

    def __init__(self, config, model_cfg, n_params: int, step: int):
        seq_len = int(config.data.seq_len)
        self.tokens_per_step = config.train.batch_size * seq_len
        self.flops_per_token = flops.train_flops_per_token(
            n_params, model_cfg.to_dict(), seq_len, model_cfg.layer_mixers())
        self.peak = flops.run_peak(config.train.peak_flops, model_cfg.dtype)
        self.restart(step)

    def restart(self, step: int):
        self.step, self.t = step, time.perf_counter()

    def tokens_per_s(self, step: int) -> float:
        """The rate since the last start; the clock restarts at `step`."""
        now = time.perf_counter()
        rate = (step - self.step) * self.tokens_per_step / max(now - self.t, 1e-9)
        self.step, self.t = step, now
        return rate

    def mfu(self, tokens_per_s: float) -> float | None:
        return flops.mfu(tokens_per_s, self.flops_per_token, jax.device_count(), self.peak)

    def entry(self, tokens_per_s: float) -> dict:
        """The speed fields of a logged entry: tokens/s, and MFU where a peak is known."""
        mfu = self.mfu(tokens_per_s)
        return {"tokens_per_s": tokens_per_s, **({} if mfu is None else {"mfu": mfu})}


class _StepLog:
    """The train step's metrics stay on the device until a log, evaluation, save or stop
    needs them (fetching every step would make the host wait on each one); they are
    checked finite when fetched, and the newest is logged when asked for."""

    def __init__(self, sinks: metrics.Sinks, speed: _Speed, schedule, saver: _Saver):
        self.sinks, self.speed, self.schedule, self.saver = sinks, speed, schedule, saver
        self.pending: list[tuple[int, Any]] = []

    def add(self, step: int, step_metrics) -> None:
        self.pending.append((step, step_metrics))

    def restart_clock(self, step: int) -> None:
        """The next logged speed counts the steps after `step`, timed from now."""
        self.speed.restart(step)

    def flush(self, *, log_now: bool) -> None:
        """Fetches the pending metrics; raises TrainingError at the first non-finite one."""
        if not self.pending:
            return
        steps = [s for s, _ in self.pending]
        values = jax.device_get([m for _, m in self.pending])
        self.pending.clear()
        for step, m in zip(steps, values):
            if not bool(m["finite"]):
                raise self._non_finite(step, float(m["loss"]))
        if log_now:
            self.sinks.show(self._entry(steps[-1], values[-1]))

    def _entry(self, step: int, m) -> dict:
        return {"step": step, "loss": float(m["loss"]),
                "lr": float(self.schedule(step - 1)),
                **self.speed.entry(self.speed.tokens_per_s(step)),
                "grad_norm": float(m["grad_norm"])}

    def _non_finite(self, step: int, loss: float) -> TrainingError:
        what = (f"loss is {loss}" if not math.isfinite(loss)
                else f"gradients or parameters became non-finite (loss {loss})")
        return TrainingError(
            f"{what} at step {step}; stopping without saving ({self.saver.last_good()}). "
            f"Try a lower train.lr, train.grad_clip=1.0 or train.precision=float32.")


# ----------------------------------------------------------------------------------- saving
class _Saver:
    """Writes a checkpoint at most once per step, and names the newest for messages.
    A step saved with its eval loss competes for the kept best (keep_best)."""

    def __init__(self, ckpt: checkpoint.Checkpointer, config, last_saved: int | None,
                 keep_best: bool = True):
        self.ckpt, self.config, self.last_saved = ckpt, config, last_saved
        self.keep_best = keep_best

    def save(self, state: _State, eval_loss: float | None = None) -> None:
        if self.last_saved == state.step:
            return
        seed = int(self.config.train.seed)
        meta = {"step": state.step, "data_position": state.step, "seed": seed,
                "early_stop": state.early.saved(),
                "rng": f"jax.random.fold_in(key({seed}), step)",
                "feature_rng": f"jax.random.fold_in(key({seed}), step // "
                               f"{max(int(self.config.model.performer_redraw_every), 1)})",
                "config": config_tools.to_plain(self.config)}
        self.ckpt.save(state.step, state.params, state.opt_state, meta, force=True,
                       eval_loss=eval_loss if self.keep_best else None)
        self.last_saved = state.step

    def check(self) -> None:
        """Raises CheckpointSaveFailed as soon as a save in flight has failed."""
        self.ckpt.check_for_errors()

    def wait(self) -> None:
        """Until every save in flight is written."""
        self.ckpt.wait()

    def last_good(self) -> str:
        """Names the newest step that is written and checked: saves come only from
        steps checked finite, a resumed step passed its checksums, and a save still in
        flight is waited for (one that failed is not named)."""
        try:
            self.ckpt.wait()
        except checkpoint.CheckpointSaveFailed:
            pass
        on_disk = [s for s in self.ckpt.all_steps()
                   if self.last_saved is not None and s <= self.last_saved]
        if not on_disk:
            return "no checkpoint was written"
        return (f"the last good checkpoint is step {max(on_disk)} in "
                f"{self.ckpt.directory}")


# ---------------------------------------------------------------------------------- signals
class _StopRequest:
    """Set by SIGINT/SIGTERM; the loop saves at the next step boundary and exits. A second
    signal gives up at once (KeyboardInterrupt), without saving."""

    def __init__(self):
        self.signum: int | None = None

    def handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\n{signal.Signals(signum).name} received: saving a checkpoint at the "
              f"current step (press Ctrl-C again to abort without saving)",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def _signals_caught() -> Iterator[_StopRequest]:
    """SIGINT/SIGTERM set the yielded request while inside; the old handlers come back."""
    request, previous = _StopRequest(), {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, request.handle)
        except ValueError:  # not the main thread (e.g. inside some test runners)
            pass
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --------------------------------------------------------------------------------- the loop
def _run_steps(state: _State, end_step: int, t_cfg, steps: runtime.Steps, feed: _Feed,
               saver: _Saver, step_log: _StepLog, sinks: metrics.Sinks,
               stop: _StopRequest) -> None:
    """Updates `state` up to `end_step`, or to an early stop; raises Interrupted after
    saving when a signal arrived."""
    start = state.step
    for s in range(start, end_step):
        state.params, state.opt_state, step_metrics = steps.train(
            state.params, state.opt_state, feed.train(s), *steps.keys(s))
        state.step = step = s + 1  # updates done
        step_log.add(step, step_metrics)
        sinks.progress.update()
        # The signal flag is read once a step: a step that saves for it has been checked
        # finite first, like every step that saves.
        signum = stop.signum
        log_now = step % t_cfg.log_every == 0
        eval_now = (bool(t_cfg.eval_every) and step % t_cfg.eval_every == 0
                    and step < t_cfg.steps)
        # The last step is saved after the loop, with its final eval (for the kept best).
        save_now = (bool(t_cfg.checkpoint_every) and step % t_cfg.checkpoint_every == 0
                    and step < t_cfg.steps)
        if s == start:
            # The first step includes compilation: a fresh run logs it, and the speed is
            # timed from its end.
            step_log.flush(log_now=log_now or step == 1)
            step_log.restart_clock(step)
        elif log_now or eval_now or save_now or signum is not None:
            step_log.flush(log_now=log_now)
        saver.check()  # a failed asynchronous save stops the run at the next step
        stopping_early, eval_loss = False, None
        if eval_now:
            stopping_early, eval_loss = _evaluate_for_early_stop(state, steps, feed, sinks)
        # A new best eval is saved even off the checkpoint interval: the kept best is
        # then the best evaluated model, not the best among the interval's steps.
        new_best = eval_now and state.early.since_best == 0 and saver.keep_best
        if save_now or stopping_early or new_best:
            # After the early stop is counted: the checkpoint records it.
            saver.save(state, eval_loss=eval_loss)
        if signum is not None:
            saver.save(state)
            saver.wait()
            raise Interrupted(signum, step)
        if stopping_early:
            return


def _evaluate_for_early_stop(state: _State, steps: runtime.Steps, feed: _Feed,
                             sinks: metrics.Sinks) -> tuple[bool, float]:
    """Evaluates and records it; (True when early stopping ends the run here, the eval
    loss)."""
    entry = _evaluate(steps.eval, state.params, feed, state.step)
    sinks.record(entry)
    sinks.progress.write(f"step {state.step}: eval_loss {entry['eval_loss']:.4f}, "
                         f"eval_accuracy {entry['eval_accuracy']:.4f}")
    if not state.early.update(entry["eval_loss"], state.step, entry["eval_accuracy"]):
        return False, entry["eval_loss"]
    sinks.progress.write(f"step {state.step}: {state.early.reason}; stopping early")
    return True, entry["eval_loss"]
