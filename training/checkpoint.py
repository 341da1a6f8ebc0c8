"""Checkpoints with orbax: parameters, optimizer state and a JSON record, saved together.

Layout: WORKDIR/checkpoints/<step>/{params, opt_state, meta}. Orbax writes each step to a
`<step>.orbax-checkpoint-tmp-*` directory and renames it when every item is written, so
a run killed mid-save leaves only a tmp directory, which `latest_step` never returns:
restore picks the previous complete step. The meta item holds the step, the data
position (= step: the data order is a pure function of (seed, step)), the RNG seed and
the config, so a checkpoint names the model it belongs to.

Every checkpoint is verified when it is read: its meta holds a checksum per saved array
(training.checksum), and a step that cannot be read (a file or folder missing, a file
cut short, an empty step folder) or whose arrays do not match their checksums raises
CheckpointDamaged naming its path; the loop then sets it aside (moved to
WORKDIR/checkpoints_damaged/, nothing deleted) and resumes from the step before.
Kept: the newest `keep` steps and, beside them, the step with the lowest eval loss
(`best_step`), so neither early stopping nor a newer, worse step can delete it.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import pathlib
import shutil
import sys
from typing import Any, Mapping

import jax

from models import layer_stack
from models.config import ModelConfig
from training import checksum, config_tools

CHECKPOINT_DIR = "checkpoints"
# Steps that failed their checks are moved here, out of orbax's sight (it would list
# them as steps), and kept for whoever wants to look at them.
DAMAGED_DIR = "checkpoints_damaged"
# The name load_for_eval (and the eval commands' --step) take for the kept best step.
BEST = "best"
# What every step holds, one folder each.
ITEMS = ("params", "opt_state", "meta")
# Model keys that change how a model is computed, not what it is: a run may resume with
# other values (e.g. bfloat16 compute or remat to save memory). ModelConfig marks them.
RUNTIME_MODEL_KEYS = ModelConfig.runtime_keys()
# Keys that say which mixer each layer has. Several spellings mean the same layers (the old
# letters "LLLS", "3*mixer,softmax", softmax_every=4; a pattern without "mixer" ignores
# model.mixer), so a resume compares the layers they expand to (ModelConfig.layer_mixers),
# not the strings.
LAYOUT_KEYS = frozenset({"mixer", "layer_pattern", "softmax_every", "num_layers"})


def layer_mixers(model_section: Mapping[str, Any]) -> list[str] | None:
    """The per-layer mixer names a config's model section builds (None if it lacks mixer
    or num_layers, or its layout keys do not make a valid model: the keys are then
    compared as they are)."""
    if not {"mixer", "num_layers"} <= set(model_section):
        return None
    keys = {k: model_section[k] for k in LAYOUT_KEYS if k in model_section}
    try:
        return ModelConfig.from_dict(keys).layer_mixers()
    except (ValueError, TypeError):
        return None


class CheckpointMismatch(ValueError):
    """A checkpoint written for another model (another mixer, width, depth...)."""


class CheckpointDamaged(ValueError):
    """A step that cannot be read back as it was written: `path`, and why (`reason`)."""

    def __init__(self, step: int, path: pathlib.Path, reason: str):
        super().__init__(f"checkpoint step {step} at {path} is damaged: {reason}")
        self.step, self.path, self.reason = step, path, reason


class CheckpointSaveFailed(RuntimeError):
    """Writing a checkpoint failed (a full disk, a lost mount): the run must stop."""


class _DropOrbaxRecords(logging.Filter):
    """Drops orbax's own log records from `level` up: a failed save logs a traceback
    from every background thread involved, a damaged step a warning per file it
    misses; the run reports each once, as CheckpointSaveFailed or CheckpointDamaged."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= self.level
                    and f"{os.sep}orbax{os.sep}" in (record.pathname or ""))


@contextlib.contextmanager
def orbax_records_hidden(level: int = logging.ERROR):
    """While inside, orbax's records from `level` up are not printed, nor the leftovers
    of its failed reads and writes (absl's logger is process wide, so the filter comes
    off again on the way out). WARNING while a step to resume from is chosen: reading
    a damaged one is expected there."""
    logger, drop = logging.getLogger("absl"), _DropOrbaxRecords(level)
    logger.addFilter(drop)
    try:
        with _orbax_leftovers_hidden():
            yield
    finally:
        logger.removeFilter(drop)


def _from_orbax(unraisable) -> bool:
    """An orbax read or write that failed leaves coroutines and event-loop callbacks
    behind, which Python reports as 'Exception ignored' tracebacks when collected."""
    marks = (f"{os.sep}orbax{os.sep}", f"{os.sep}asyncio{os.sep}")
    code = getattr(unraisable.object, "cr_code", None)
    if code is not None and any(m in code.co_filename for m in marks):
        return True
    tb = unraisable.exc_traceback
    while tb is not None:
        if any(m in tb.tb_frame.f_code.co_filename for m in marks):
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def _orbax_leftovers_hidden():
    """While inside, and for the garbage collected on the way out, the leftovers of
    orbax's failed reads and writes are not printed (the run names the step once, as
    CheckpointDamaged or CheckpointSaveFailed); anything else goes to the previous
    hook. sys.unraisablehook is process wide, so it is put back on the way out."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _from_orbax(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        try:
            gc.collect()
        finally:
            sys.unraisablehook = previous


def _first_line(error: BaseException) -> str:
    """An exception as one short line (tensorstore's messages run to many). The
    innermost cause says what failed (a file too short, a missing key); the outer ones
    wrap it in a dump of the array's spec."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(error).__name__}: {line[:300]}"


def _ocp():
    import orbax.checkpoint as ocp  # heavy import; only where checkpoints are touched
    return ocp


class Checkpointer:
    """Saves and restores steps under WORKDIR/checkpoints; every restore is verified.

    keep: the newest steps kept (0: all); keep_best: also keep the step with the lowest
    eval loss among those saved with one (`save(..., eval_loss=)`); read_only: for
    readers (evaluation), which neither create the folder nor clean it up."""

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 3, async_save: bool = True,
                 keep_best: bool = True, read_only: bool = False):
        ocp = _ocp()
        self.directory = pathlib.Path(workdir).resolve() / CHECKPOINT_DIR
        # Which steps stay is decided here (_prune), not by orbax's max_to_keep or
        # preservation policies: orbax does not keep the eval losses of a run that was
        # started again, so its best-N forgot the best step on every resume.
        self._keep = int(keep) if keep and keep > 0 else 0
        self._keep_best = keep_best
        self._eval_loss: dict[int, float | None] = {}  # step -> its eval loss, as read
        # Listing the steps warns about each damaged one's files; the step is named
        # once when it is read (CheckpointDamaged), so those warnings are not shown.
        with orbax_records_hidden(logging.WARNING):
            self._manager = self._open_manager(ocp, read_only, async_save)
        self._saving: int | None = None  # the step of the save in flight, for messages
        self._failed = False  # a save failure was raised once already
        self._in_flight = False  # a save was begun and its end not yet collected

    def _open_manager(self, ocp, read_only: bool, async_save: bool):
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=async_save,
                # Leftovers of a save that was killed; a reader (an evaluation while
                # the run trains) must not take a save in flight for one.
                cleanup_tmp_directories=not read_only,
                create=not read_only),
            item_handlers={"params": ocp.StandardCheckpointHandler(),
                           "opt_state": ocp.StandardCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    # -- queries
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def step_path(self, step: int) -> pathlib.Path:
        return self.directory / str(int(step))

    def _check_items(self, step: int) -> None:
        """CheckpointDamaged, in words, for a step folder that is empty or lacks an
        item's folder (orbax would say KeyError: 'Unknown key')."""
        path = self.step_path(step)
        present = {p.name for p in path.iterdir()} if path.is_dir() else set()
        if not present:
            raise CheckpointDamaged(step, path, "the folder is empty")
        missing = [item for item in ITEMS if item not in present]
        if missing:
            raise CheckpointDamaged(step, path, f"its {', '.join(missing)} folder is missing")

    def meta(self, step: int) -> dict:
        """The step's JSON record; CheckpointDamaged when it cannot be read."""
        ocp = _ocp()
        self._check_items(step)
        try:
            meta = self._manager.restore(
                step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:
            raise CheckpointDamaged(step, self.step_path(step),
                                    f"its meta cannot be read ({_first_line(e)})") from e
        if not isinstance(meta, dict):
            raise CheckpointDamaged(step, self.step_path(step), "its meta is not a record")
        return meta

    def param_shapes(self, step: int) -> dict[str, tuple]:
        """{name: shape} as saved; CheckpointDamaged when the metadata cannot be read."""
        self._check_items(step)
        try:
            tree = self._manager.item_metadata(step)["params"]
            tree = getattr(tree, "tree", tree)
            return {name: tuple(m.shape) for name, m in tree.items()}
        except Exception as e:
            raise CheckpointDamaged(step, self.step_path(step),
                                    f"its parameters cannot be listed ({_first_line(e)})"
                                    ) from e

    def best_step(self) -> int | None:
        """The kept step with the lowest eval loss (None: no step was saved with one)."""
        best = None
        for step in self.all_steps():
            if step not in self._eval_loss:
                try:
                    loss = self.meta(step).get("eval_loss")
                except CheckpointDamaged:
                    continue
                self._eval_loss[step] = None if loss is None else float(loss)
            loss = self._eval_loss[step]
            if loss is not None and (best is None or loss < best[0]):
                best = (loss, step)
        return None if best is None else best[1]

    def _prune(self) -> None:
        """Deletes the steps that are neither among the newest `keep` nor the best;
        called by `wait` once a save of this run is written."""
        if not self._keep:
            return
        steps = sorted(self.all_steps())
        kept = set(steps[-self._keep:])
        if self._keep_best and (best := self.best_step()) is not None:
            kept.add(best)
        for step in steps:
            if step not in kept:
                self._manager.delete(step)
                self._eval_loss.pop(step, None)

    # -- save / restore
    def save(self, step: int, params, opt_state, meta: Mapping[str, Any], *,
             force: bool = False, eval_loss: float | None = None):
        """Writes the step (asynchronously if so opened), with a checksum per array in
        its meta; `eval_loss` ranks it for the kept best."""
        ocp = _ocp()
        # The previous save is finished by now (orbax waits for it anyway): a failure
        # there is reported under its own step before this one begins; then the steps
        # it made room for go.
        self.wait()
        meta = dict(meta, checksums={**checksum.checksums(params, "params"),
                                     **checksum.checksums(opt_state, "opt_state")})
        # A non-finite eval ranks nowhere (and JSON has no NaN).
        loss = None if eval_loss is None or not math.isfinite(eval_loss) else float(eval_loss)
        if loss is not None:
            meta["eval_loss"] = loss
        self._saving, self._in_flight = int(step), True
        self._eval_loss[int(step)] = loss
        try:
            return self._manager.save(
                int(step), force=force,
                args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                        opt_state=ocp.args.StandardSave(opt_state),
                                        meta=ocp.args.JsonSave(meta)))
        except Exception as e:
            raise self._save_failed(e) from e

    def check_for_errors(self) -> None:
        """Raises CheckpointSaveFailed if an asynchronous save has failed. Cheap: a save
        still running is not waited for; one that has ended is collected once (orbax
        reports a failed finalize only to whoever waits)."""
        try:
            self._manager.check_for_errors()
            running = self._manager.is_saving_in_progress()
        except Exception as e:
            raise self._save_failed(e) from e
        if self._in_flight and not running:
            self.wait()

    def _save_failed(self, error: BaseException) -> CheckpointSaveFailed:
        self._failed = True
        step = "" if self._saving is None else f" step {self._saving}"
        return CheckpointSaveFailed(
            f"saving checkpoint{step} to {self.directory} failed ({_first_line(error)}); "
            f"is the disk full or the directory gone? Fix it and run the same command to "
            f"resume from the newest complete step.")

    def check_compatible(self, step: int, shapes: Mapping[str, tuple],
                         model_section: Mapping[str, Any] | None = None) -> None:
        """Raises CheckpointMismatch naming the first parameter that does not fit."""
        # Read in the model's layout: scan_layers may differ (training.param_layout).
        saved = layer_stack.convert_shapes(self.param_shapes(step), shapes)
        problems = []
        for name in sorted(set(shapes) - set(saved)):
            problems.append(f"parameter {name!r} {tuple(shapes[name])} is in the model but not in "
                            f"the checkpoint")
        for name in sorted(set(saved) - set(shapes)):
            problems.append(f"parameter {name!r} {saved[name]} is in the checkpoint but not in the "
                            f"model")
        for name in sorted(set(saved) & set(shapes)):
            if tuple(saved[name]) != tuple(shapes[name]):
                problems.append(f"parameter {name!r} has shape {tuple(saved[name])} in the checkpoint "
                                f"but {tuple(shapes[name])} in the model")
        if not problems and model_section is not None:
            # Same shapes can still be another model (softmax and linear attention have the same
            # projections): the architecture keys of the saved config must match too.
            try:
                old = self.meta(step).get("config", {}).get("model", {})
            except Exception:
                old = {}
            self._check_same_model(step, old, model_section)
        if not problems:
            return
        hint = ""
        if model_section is not None:
            try:
                old = self.meta(step).get("config", {}).get("model", {})
                diffs = [f"model.{k}={old.get(k)!r} there, {model_section.get(k)!r} here"
                         for k in sorted(set(old) | set(model_section))
                         if k != "vocab_size" and old.get(k) != model_section.get(k)]
                if diffs:
                    hint = " The checkpoint was written with " + "; ".join(diffs[:5]) + "."
            except Exception:  # the hint is a courtesy; the parameter names are the message
                pass
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointMismatch(
            f"checkpoint at step {step} in {self.directory} does not fit this model: "
            + "; ".join(problems[:3]) + more + "." + hint +
            " Resume with the config it was written with, or use a fresh --workdir.")

    def _check_same_model(self, step: int, old: Mapping[str, Any],
                          new: Mapping[str, Any]) -> None:
        """CheckpointMismatch unless the saved and current model sections build the same
        architecture: equal keys but the runtime ones, with the layout keys compared as
        the per-layer mixers they expand to."""
        old_layers, new_layers = layer_mixers(old), layer_mixers(new)
        by_layers = old_layers is not None and new_layers is not None
        skip = RUNTIME_MODEL_KEYS | (LAYOUT_KEYS if by_layers else frozenset())
        fix = "Resume with the config it was written with, or use a fresh --workdir."
        for key in sorted(set(old) & set(new) - skip):
            if old[key] != new[key]:
                raise CheckpointMismatch(
                    f"checkpoint at step {step} in {self.directory} was written with "
                    f"model.{key}={old[key]!r}, but this config has model.{key}="
                    f"{new[key]!r}; its parameters would be read as another model's. {fix}")
        if by_layers and old_layers != new_layers:
            spelt = ", ".join(f"model.{k}={old[k]!r}" for k in sorted(LAYOUT_KEYS) if k in old)
            raise CheckpointMismatch(
                f"checkpoint at step {step} in {self.directory} has the layers "
                f"{old_layers} ({spelt}), but this config builds {new_layers}; its "
                f"parameters would be read as another model's. {fix}")

    def restore(self, step: int, abstract_params, abstract_opt_state=None):
        """(params, opt_state or None, meta), checked against the saved checksums;
        CheckpointDamaged if the step cannot be read or does not match them. Abstract
        trees carry the target shardings."""
        ocp = _ocp()
        meta = self.meta(step)
        items = dict(params=ocp.args.StandardRestore(abstract_params))
        if abstract_opt_state is not None:
            items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
        try:
            with _orbax_leftovers_hidden():
                out = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        except Exception as e:
            raise CheckpointDamaged(step, self.step_path(step),
                                    f"its arrays cannot be read ({_first_line(e)})") from e
        params = out["params"]
        opt_state = out["opt_state"] if abstract_opt_state is not None else None
        saved = meta.get("checksums")
        if saved is not None:  # checkpoints from before checksums load unchecked
            read = checksum.checksums(params, "params")
            if opt_state is not None:
                read.update(checksum.checksums(opt_state, "opt_state"))
            else:
                saved = {k: v for k, v in saved.items() if k.startswith("params")}
            wrong = checksum.first_difference(saved, read)
            if wrong is not None:
                raise CheckpointDamaged(step, self.step_path(step),
                                        f"{wrong} does not match its checksum")
        return params, opt_state, meta

    def set_aside(self, step: int) -> pathlib.Path:
        """Moves a damaged step out of checkpoints/ (kept, never deleted); its new path."""
        self.wait()
        target_dir = self.directory.parent / DAMAGED_DIR
        target, n = target_dir / str(int(step)), 1
        while target.exists():  # the same step damaged twice: keep both
            target, n = target_dir / f"{int(step)}.{n}", n + 1
        if jax.process_index() == 0:  # one mover; the others wait for it below
            target_dir.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.step_path(step)), str(target))
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"set_aside_{int(step)}")
        with orbax_records_hidden(logging.WARNING):
            self._manager.reload()
        return target

    def wait(self):
        """Until the save in flight is written; then the steps it made room for go
        (only then: a save that fails deletes nothing, and a run that has not saved,
        such as one still choosing the step to resume from, prunes nothing)."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._save_failed(e) from e
        if self._in_flight:
            self._in_flight = False
            self._prune()

    def close(self):
        """Waits for saves in flight, then closes. A save failure already reported is
        not raised again here (it would hide the first report under a second)."""
        try:
            self.wait()
        except CheckpointSaveFailed:
            if not self._failed:
                raise
        finally:
            with contextlib.suppress(Exception) if self._failed else contextlib.nullcontext():
                self._manager.close()


def load_for_eval(workdir: str | os.PathLike, step: int | str | None = None, *,
                  data: bool = True):
    """Rebuilds a trained model from a workdir: (model, config, dataset, step).

    Reads WORKDIR/config.json and the tokenizer saved with the run
    (training.workdir_tokenizer), builds the dataset with that tokenizer and the model as
    training did, and restores the parameters onto one device: of `step`, of the kept
    best step (`step="best"`, the lowest eval loss), or (None) of the newest step that
    passes its checks; a newer damaged step is named on stderr, one line, and left where
    it is (an evaluation changes nothing in the workdir). A corpus the saved tokenizer
    does not fit is refused (TokenizerMismatch, naming the file). data=False: no corpus
    is read; `dataset` is then a workdir_tokenizer.Vocabulary (tokenizer, vocab_size).
    """
    from flax import nnx

    from training import builders, model_state, param_layout, workdir_tokenizer

    config = config_tools.load_config(workdir)
    dataset = workdir_tokenizer.eval_dataset(config, workdir, data=data)
    model_cfg = builders.build_model_config(config, dataset)
    # Only parameters are restored; the model's other draws (Performer's omega) are made
    # again from the run's seed, so through the PRNG the run was keyed with.
    with nnx.use_eager_sharding(False), \
            jax.default_prng_impl(config_tools.prng_impl(config)):
        model = builders.model_factory(model_cfg, config.train.seed)()
    params_state = nnx.state(model, nnx.Param)
    names = {model_state.path_name(p): p for p, _ in params_state.flat_state()}
    current = model_state.flat_params(params_state)

    if not (pathlib.Path(workdir) / CHECKPOINT_DIR).is_dir():
        raise FileNotFoundError(f"no checkpoints in {workdir}: train first "
                                f"(python train.py --config=... --workdir={workdir})")
    ckpt = Checkpointer(workdir, async_save=False, read_only=True)
    try:
        if step == BEST:
            step = ckpt.best_step()
            if step is None:
                raise FileNotFoundError(
                    f"no checkpoint in {ckpt.directory} was saved with an eval loss, so "
                    f"none is the best: train with train.eval_every > 0, or pass a step")
        candidates = ckpt.all_steps()[::-1] if step is None else [int(step)]
        if not candidates:
            raise FileNotFoundError(f"no complete checkpoint in {ckpt.directory}: train first "
                                    f"(python train.py --config=... --workdir={workdir})")
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device)
                    for k, v in current.items()}
        with orbax_records_hidden(logging.WARNING):  # a damaged step is named below
            for i, step in enumerate(candidates):
                try:
                    ckpt.check_compatible(step, {k: v.shape for k, v in current.items()},
                                          config.model.to_dict())
                    params, _, _ = param_layout.restore(ckpt, step, abstract)
                    break
                except CheckpointDamaged as e:
                    if i + 1 == len(candidates):
                        raise
                    print(f"{e}; using step {candidates[i + 1]}", file=sys.stderr,
                          flush=True)
    finally:
        ckpt.close()
    nnx.update(model, nnx.State.from_flat_path(
        [(path, params[name]) for name, path in names.items()]))
    return model, config, dataset, int(step)
