"""Checkpoints with orbax: parameters, optimizer state and a JSON record, saved together.

Layout: WORKDIR/checkpoints/<step>/{params, opt_state, meta}. Orbax writes each step to a
`<step>.orbax-checkpoint-tmp-*` directory and renames it when every item is written, so
a run killed mid-save leaves only a tmp directory, which `latest_step` never returns:
restore picks the previous complete step. The meta item holds the step, the data
position (= step: the data order is a pure function of (seed, step)), the RNG seed and
the config, so a checkpoint names the model it belongs to.
"""
from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping

import jax

from models.config import ModelConfig
from training import config_tools

CHECKPOINT_DIR = "checkpoints"
# Model keys that change how a model is computed, not what it is: a run may resume with
# other values (e.g. bfloat16 compute or remat to save memory). ModelConfig marks them.
RUNTIME_MODEL_KEYS = ModelConfig.runtime_keys()


class CheckpointMismatch(ValueError):
    """A checkpoint written for another model (another mixer, width, depth...)."""


def _ocp():
    import orbax.checkpoint as ocp  # heavy import; only where checkpoints are touched
    return ocp


class Checkpointer:
    def __init__(self, workdir: str | os.PathLike, *, keep: int = 3, async_save: bool = True):
        ocp = _ocp()
        self.directory = pathlib.Path(workdir).resolve() / CHECKPOINT_DIR
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep if keep and keep > 0 else None,
                enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True,  # leftovers of a save that was killed
                create=True),
            item_handlers={"params": ocp.StandardCheckpointHandler(),
                           "opt_state": ocp.StandardCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    # -- queries
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def meta(self, step: int) -> dict:
        ocp = _ocp()
        return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"]

    def param_shapes(self, step: int) -> dict[str, tuple]:
        tree = self._manager.item_metadata(step)["params"]
        tree = getattr(tree, "tree", tree)
        return {name: tuple(m.shape) for name, m in tree.items()}

    # -- save / restore
    def save(self, step: int, params, opt_state, meta: Mapping[str, Any], *, force: bool = False):
        ocp = _ocp()
        return self._manager.save(
            int(step), force=force,
            args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                    opt_state=ocp.args.StandardSave(opt_state),
                                    meta=ocp.args.JsonSave(dict(meta))))

    def check_compatible(self, step: int, shapes: Mapping[str, tuple],
                         model_section: Mapping[str, Any] | None = None) -> None:
        """Raises CheckpointMismatch naming the first parameter that does not fit."""
        saved = self.param_shapes(step)
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
            for key in sorted(set(old) & set(model_section) - RUNTIME_MODEL_KEYS):
                if old[key] != model_section[key]:
                    raise CheckpointMismatch(
                        f"checkpoint at step {step} in {self.directory} was written with "
                        f"model.{key}={old[key]!r}, but this config has model.{key}="
                        f"{model_section[key]!r}; its parameters would be read as another model's. "
                        f"Resume with the config it was written with, or use a fresh --workdir.")
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

    def restore(self, step: int, abstract_params, abstract_opt_state=None):
        """(params, opt_state or None, meta). Abstract trees carry the target shardings."""
        ocp = _ocp()
        items = dict(params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore())
        if abstract_opt_state is not None:
            items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
        out = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        return out["params"], out.get("opt_state") if abstract_opt_state is not None else None, \
            out["meta"]

    def wait(self):
        self._manager.wait_until_finished()

    def close(self):
        self._manager.wait_until_finished()
        self._manager.close()


def load_for_eval(workdir: str | os.PathLike, step: int | None = None):
    """Rebuilds a trained model from a workdir: (model, config, dataset, step).

    Reads WORKDIR/config.json, builds the dataset and model as training did, and restores
    the parameters of the newest complete checkpoint (or `step`) onto one device.
    """
    from flax import nnx

    from training import builders, model_state

    config = config_tools.load_config(workdir)
    dataset = builders.build_dataset(config)
    model_cfg = builders.build_model_config(config, dataset)
    with nnx.use_eager_sharding(False):
        model = builders.model_factory(model_cfg, config.train.seed)()
    params_state = nnx.state(model, nnx.Param)
    names = {model_state.path_name(p): p for p, _ in params_state.flat_state()}
    current = model_state.flat_params(params_state)

    ckpt = Checkpointer(workdir, async_save=False)
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {ckpt.directory}: train first "
                                    f"(python train.py --config=... --workdir={workdir})")
        ckpt.check_compatible(step, {k: v.shape for k, v in current.items()},
                              config.model.to_dict())
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device)
                    for k, v in current.items()}
        params, _, _ = ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    nnx.update(model, nnx.State.from_flat_path(
        [(path, params[name]) for name, path in names.items()]))
    return model, config, dataset, int(step)
