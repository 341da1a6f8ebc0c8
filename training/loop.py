"""The training loop: config -> data -> mesh -> model + optimizer -> steps, evals, checkpoints.

Read top to bottom, `train()` does what train.py promises:
  1. build the dataset and the model config (vocab from the dataset), the device mesh;
  2. describe the model abstractly, shard its parameters by logical-axis rules;
  3. restore the newest complete checkpoint if the workdir has one (after checking it
     fits the model), else initialise inside one sharded jit;
  4. run one jitted, donated train step per batch; the batch at step s is
     dataset.batch(s), so the data position is the step and resume is exact;
  5. log, evaluate, checkpoint; stop cleanly on NaN (no save) or on SIGINT/SIGTERM (save).
"""
from __future__ import annotations

import dataclasses
import math
import signal
import sys
import time
from typing import Any

import jax
import numpy as np
import optax

from training import builders, checkpoint, config_tools, flops, metrics, model_state, optim
from training import sharding as shd
from training.step import make_eval_step, make_train_step


class TrainingError(RuntimeError):
    """A run that must stop: non-finite loss and the like. The message says what to do."""


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a checkpoint at `step` was written."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step


# ----------------------------------------------------------------------------- helpers
@dataclasses.dataclass
class _Stop:
    signum: int | None = None


class _Patience:
    """Early stopping: True once `limit` evaluations in a row bring no new best eval loss
    (limit 0: never). The best validation loss a run reports is unchanged by stopping."""

    def __init__(self, limit: int):
        self.limit, self.best, self.since_best = limit, math.inf, 0

    def update(self, eval_loss: float) -> bool:
        if eval_loss < self.best:
            self.best, self.since_best = eval_loss, 0
        else:
            self.since_best += 1
        return self.limit > 0 and self.since_best >= self.limit


def _install_signal_handlers(flag: _Stop):
    """SIGINT/SIGTERM set a flag; the loop saves at the next step boundary and exits."""
    previous = {}

    def handler(signum, frame):
        if flag.signum is not None:  # a second Ctrl-C: give up at once
            raise KeyboardInterrupt
        flag.signum = signum
        print(f"\n{signal.Signals(signum).name} received: saving a checkpoint at the current step "
              f"(press Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. inside some test runners)
            pass
    return previous


def _restore_signal_handlers(previous):
    for sig, h in previous.items():
        signal.signal(sig, h)


def _abstract(shapes_dtypes: dict, shardings: dict):
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
            for k, v in shapes_dtypes.items()}


class _Progress:
    """tqdm when asked for and available; otherwise a line per log step."""

    def __init__(self, enabled: bool, start: int, total: int):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=start, dynamic_ncols=True, unit="step",
                                file=sys.stderr, mininterval=0.5)
            except ImportError:
                pass

    def update(self, n=1):
        if self.bar is not None:
            self.bar.update(n)

    def show(self, entry: dict):
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{entry['loss']:.4f}",
                                 tok_s=f"{entry['tokens_per_s']:.0f}", refresh=False)
        else:
            print(f"step {entry['step']}: loss {entry['loss']:.4f}, lr {entry['lr']:.2e}, "
                  f"{entry['tokens_per_s']:.0f} tok/s, mfu {100 * entry['mfu']:.2f}%", flush=True)

    def write(self, text: str):
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------- train
def train(config, workdir: str) -> dict[str, Any]:
    """Trains (or resumes) the run in `workdir`; returns the final eval metrics."""
    config_tools.check_config(config)
    # Every key of the run (init, dropout) comes from this generator; scoped to the run.
    with jax.default_prng_impl(config.train.get("prng_impl", "threefry2x32")):
        return _train(config, workdir)


def _train(config, workdir: str) -> dict[str, Any]:
    is_main = jax.process_index() == 0
    t_cfg = config.train

    # 1. Data, model config, mesh.
    try:
        dataset = builders.build_dataset(config)
    except (ValueError, OSError, KeyError, ImportError) as e:  # the data package names the file
        raise config_tools.ConfigError(f"data: {e.args[0] if e.args else e}") from e
    model_cfg = builders.build_model_config(config, dataset)
    mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    shd.check_batch_divides(t_cfg.batch_size // t_cfg.grad_accum, mesh,
                            "train.batch_size / train.grad_accum")
    repl, batch_sh = shd.replicated(mesh), shd.batch_sharding(mesh)

    # 2. The model, abstractly: names, shapes, logical axes -> shardings.
    make_model = builders.model_factory(model_cfg, t_cfg.seed)
    graphdef, template, abstract_rest, names, logical, shapes = model_state.describe(make_model)
    p_sh = shd.param_shardings(logical, shapes, mesh)
    abstract_params = {model_state.path_name(p): v.value for p, v in template.flat_state()}
    tx, schedule = optim.make_optimizer(t_cfg, abstract_params, logical)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    o_sh = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, p_sh,
                                 transform_non_params=lambda _: repl,
                                 is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))

    # 3. Restore or initialise. A checkpoint of another model stops here, before anything
    # in the workdir is touched.
    ckpt = checkpoint.Checkpointer(workdir, keep=t_cfg.keep_checkpoints,
                                   async_save=t_cfg.async_checkpoints)
    start = ckpt.latest_step()
    if start is not None:
        try:
            ckpt.check_compatible(start, shapes, config.model.to_dict())
        except Exception:
            ckpt.close()
            raise
    if is_main:
        config_tools.save_config(config, workdir)

    params, rest = model_state.init_sharded(make_model, p_sh, repl)
    parts = model_state.ModelParts(graphdef, template, rest, names, logical, shapes)
    restored = start is not None
    # Early stopping's state travels in the checkpoint, so a resumed run stops where an
    # uninterrupted one would (and a run that stopped early stays stopped).
    patience = _Patience(int(t_cfg.get("early_stop_patience", 0) or 0))
    end_step = t_cfg.steps
    if not restored:
        start = 0
        opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
    else:
        del params  # replaced by the checkpoint's
        params, opt_state, meta = ckpt.restore(
            start, _abstract(abstract_params, p_sh),
            jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract_opt, o_sh))
        if int(meta.get("data_position", start)) != start:
            raise TrainingError(f"checkpoint {start} has data position {meta['data_position']}")
        early = meta.get("early_stop") or {}
        patience.best = math.inf if early.get("best") is None else float(early["best"])
        patience.since_best = int(early.get("since_best", 0))
        if early.get("stopped"):
            end_step = start

    n_params = model_state.num_params(shapes)
    tokens_per_step = t_cfg.batch_size * int(config.data.seq_len)
    flops_per_token = flops.train_flops_per_token(n_params, model_cfg.to_dict(),
                                                  int(config.data.seq_len),
                                                  model_cfg.layer_mixers())
    peak = t_cfg.peak_flops or flops.peak_flops_per_device(precision=model_cfg.dtype)

    # 4. Compiled steps: explicit shardings, donated state.
    train_step = jax.jit(make_train_step(parts, tx, t_cfg.grad_accum, mesh),
                         in_shardings=(p_sh, o_sh, batch_sh, repl),
                         out_shardings=(p_sh, o_sh, repl), donate_argnums=(0, 1))
    eval_step = jax.jit(make_eval_step(parts), in_shardings=(p_sh, batch_sh),
                        out_shardings=repl)
    base_key = jax.random.key(int(t_cfg.seed))

    log = metrics.MetricsFile(workdir, resume_step=start if restored else None, enabled=is_main)
    wandb = metrics.WandbLogger(workdir, mode=config.logging.wandb, project=config.logging.project,
                                name=config.logging.name, config=config_tools.to_plain(config),
                                enabled=is_main)
    if is_main:
        print(f"{n_params:,} parameters; mixers {model_cfg.layer_mixers()}; mesh "
              f"{dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} "
              f"device(s); {'resuming from step ' + str(start) if start else 'starting fresh'}",
              file=sys.stderr, flush=True)

    def evaluate(step: int, record: bool = True) -> dict:
        total = np.zeros(3)
        for b in dataset.eval_batches(t_cfg.batch_size, t_cfg.eval_batches):
            total += np.asarray(jax.device_get(eval_step(params, shd.global_batch(b, batch_sh))))
        entry = {"step": step, "eval_loss": total[0] / max(total[1], 1.0),
                 "eval_accuracy": total[2] / max(total[1], 1.0)}
        if record:
            log.write(entry)
            wandb.log(entry)
        return entry

    last_saved = start if ckpt.latest_step() is not None else None

    def save(step: int):
        nonlocal last_saved
        if last_saved == step:
            return
        meta = {"step": step, "data_position": step, "seed": int(t_cfg.seed),
                "early_stop": {"best": None if math.isinf(patience.best) else patience.best,
                               "since_best": patience.since_best,
                               "stopped": step == end_step and step < t_cfg.steps},
                "rng": f"jax.random.fold_in(key({int(t_cfg.seed)}), step)",
                "config": config_tools.to_plain(config)}
        ckpt.save(step, params, opt_state, meta, force=True)
        last_saved = step

    pending: list[tuple[int, Any]] = []
    timer = {"t": time.perf_counter(), "step": start}

    def flush(step: int, *, log_now: bool):
        """Fetch pending step metrics; stop on the first non-finite loss."""
        values = jax.device_get([m for _, m in pending])
        steps = [s for s, _ in pending]
        pending.clear()
        for s, m in zip(steps, values):
            if not bool(m["finite"]):
                where = (f"the last good checkpoint is step {last_saved} in {ckpt.directory}"
                         if last_saved is not None else "no checkpoint was written")
                what = (f"loss is {float(m['loss'])}" if not math.isfinite(float(m["loss"]))
                        else f"gradients or parameters became non-finite (loss {float(m['loss'])})")
                raise TrainingError(
                    f"{what} at step {s}; stopping without saving ({where}). "
                    f"Try a lower train.lr, train.grad_clip=1.0 or train.precision=float32.")
        if log_now and values:
            now = time.perf_counter()
            done = step - timer["step"]
            tok_s = done * tokens_per_step / max(now - timer["t"], 1e-9)
            timer.update(t=now, step=step)
            entry = {"step": step, "loss": float(values[-1]["loss"]),
                     "lr": float(schedule(step - 1)), "tokens_per_s": tok_s,
                     "grad_norm": float(values[-1]["grad_norm"]),
                     "mfu": flops.mfu(tok_s, flops_per_token, jax.device_count(), peak)}
            log.write(entry)
            wandb.log(entry)
            progress.show(entry)

    stop = _Stop()
    previous = _install_signal_handlers(stop)
    progress = _Progress(config.logging.progress and is_main, start, t_cfg.steps)
    result: dict[str, Any] = {}
    try:
        for s in range(start, end_step):
            batch = shd.global_batch(dataset.batch(s, t_cfg.batch_size), batch_sh)
            params, opt_state, m = train_step(params, opt_state, batch,
                                              jax.random.fold_in(base_key, s))
            step = s + 1  # updates done
            pending.append((step, m))
            progress.update()
            if s == start:  # the first step includes compilation: time from its end
                flush(step, log_now=step % t_cfg.log_every == 0 or step == 1)
                timer.update(t=time.perf_counter(), step=step)
                log_now = False
            else:
                log_now = step % t_cfg.log_every == 0
            eval_now = t_cfg.eval_every and step % t_cfg.eval_every == 0 and step < t_cfg.steps
            ckpt_now = t_cfg.checkpoint_every and step % t_cfg.checkpoint_every == 0
            if pending and (log_now or eval_now or ckpt_now or stop.signum is not None):
                flush(step, log_now=log_now)
            early_stop = False
            if eval_now:
                e = evaluate(step)
                progress.write(f"step {step}: eval_loss {e['eval_loss']:.4f}, "
                               f"eval_accuracy {e['eval_accuracy']:.4f}")
                early_stop = patience.update(e["eval_loss"])
                if early_stop:
                    end_step = step
                    progress.write(f"step {step}: no new best eval_loss in {patience.limit} evaluations "
                                   f"(best {patience.best:.4f}); stopping early")
            if ckpt_now or early_stop:
                save(step)  # after end_step is set: the checkpoint records the stop
            if stop.signum is not None:
                save(step)
                ckpt.wait()
                raise Interrupted(stop.signum, step)
            if early_stop:
                break
        final_step = max(start, end_step)
        flush(final_step, log_now=bool(pending))
        save(final_step)
        # A finished run started again only re-reports: its final eval is already logged.
        result = evaluate(final_step, record=not (restored and start >= end_step))
        ckpt.wait()
    finally:
        progress.close()
        _restore_signal_handlers(previous)
        try:
            ckpt.close()  # waits for an async save in flight
        finally:
            log.close()
            wandb.close()
    result["num_params"] = n_params
    result["step"] = final_step
    return result
