"""How long a sweep will take, said before it starts.

From measurements when there are any: the mean wall time of the grid's runs that
already finished in the sweep directory (their done.json). Otherwise from FLOPs: each
run's training tokens (steps x batch x seq_len) and evaluations times the model's FLOPs
per token (models.flops, from a parameter count taken abstractly: no device is touched,
so a GPU is left to the runs), at an assumed rate, plus a fixed start-up (interpreter,
compile) per run. The assumed rates are stated in the line printed:
  CPU: 1.5e10 FLOP/s, measured: configs/mqar.py trains at 23k tokens/s on the shared
       2-core CPU, 16% of the nominal 1e11 (training.flops);
  GPU / TPU: 30% of the device's peak (training.flops.PEAK_FLOPS) at the run's precision.
Small models run below these rates, so a FLOP estimate is a floor; the speed task
(timings, nothing trained) is estimated only from finished runs.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from typing import Any, Mapping, NamedTuple

from sweeps import grid

CPU_FLOPS = 1.5e10
ACCELERATOR_MFU = 0.3
STARTUP_S = {"cpu": 15.0, "gpu": 60.0, "tpu": 60.0}


class Estimate(NamedTuple):
    seconds: float | None   # None: no basis for an estimate
    basis: str


def platform() -> tuple[str, str]:
    """(cpu | gpu | tpu, device name) without initialising JAX's backends (a backend
    in the sweep's own process would take the GPU memory its runs need)."""
    forced = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if forced == "cpu":
        return "cpu", "cpu"
    if forced in ("", "cuda", "gpu") and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
            if out.returncode == 0 and names:
                return "gpu", names[0]
        except (OSError, subprocess.SubprocessError):
            pass
    if forced in ("", "tpu") and glob.glob("/dev/accel*"):
        return "tpu", "tpu v5e"
    return "cpu", "cpu"


def device_rate(kind: str, name: str, precision: str) -> float:
    from training import flops
    if kind == "cpu":
        return CPU_FLOPS
    name = name.lower()
    dtype = "float32" if precision == "float32" else "bfloat16"
    for (chip, dt), peak in flops.PEAK_FLOPS.items():
        if chip in name and dt == dtype:
            return ACCELERATOR_MFU * peak
    return ACCELERATOR_MFU * flops.PEAK_FLOPS[("a100", "bfloat16")]


def _vocab(config) -> int:
    """The model's vocabulary as far as the config says without building the data: the
    model's, the task's, else 256 (bytes): an estimate's input, not the run's."""
    from data.base import cfg_get
    for key in ("model.vocab_size", "data.mqar_vocab_size", "data.vocab_size"):
        v = cfg_get(config, key)
        if v:
            return int(v)
    return 256


def _num_params(model_cfg, cache: dict) -> int:
    import jax
    from flax import nnx

    import models
    key = repr(sorted(model_cfg.to_dict().items()))
    if key not in cache:
        def params():
            return nnx.state(models.LanguageModel(model_cfg, rngs=nnx.Rngs(0)), nnx.Param)
        with nnx.use_eager_sharding(False):
            shapes = jax.eval_shape(params)
        cache[key] = int(sum(x.size for x in jax.tree.leaves(shapes)))
    return cache[key]


def run_seconds(config, rate: float, startup: float, cache: dict) -> float:
    """One training run's estimated wall time (its train.py config): start-up, then its
    train and eval FLOPs at `rate`."""
    from data.base import cfg_get
    from models.config import ModelConfig
    from training import config_tools, flops

    d = config_tools.model_config_dict(config, _vocab(config))
    model_cfg = ModelConfig.from_dict(d)
    seq_len = int(cfg_get(config, "data.seq_len", 256))
    per_token = flops.train_flops_per_token(_num_params(model_cfg, cache), d, seq_len)
    t = config.train
    tokens = int(t.steps) * int(t.batch_size) * seq_len
    evals = (int(t.steps) // int(t.eval_every) if t.eval_every else 0) + 1
    eval_tokens = evals * int(t.eval_batches) * int(t.batch_size) * seq_len
    return startup + (tokens + eval_tokens / 3) * per_token / rate


def _finished_wall_s(full: list[dict], workdir: str) -> list[float]:
    out = []
    for r in full:
        path = os.path.join(workdir, r["name"], "done.json")
        try:
            with open(path) as f:
                wall = json.load(f).get("wall_s")
        except (OSError, ValueError):
            continue
        if isinstance(wall, (int, float)) and wall > 0:
            out.append(float(wall))
    return out


def estimate(cfg: Mapping[str, Any], full: list[dict], todo: list[dict],
             workdir: str) -> Estimate:
    """The time of the `todo` runs of the grid `full` (see the module docstring)."""
    if not todo:
        return Estimate(0.0, "nothing to run")
    walls = _finished_wall_s(full, workdir)
    if walls:
        mean = sum(walls) / len(walls)
        return Estimate(mean * len(todo), f"the mean of {len(walls)} finished runs here, "
                                          f"{format_seconds(mean)} each")
    if cfg.get("task") == "speed":
        return Estimate(None, "a timing sweep is estimated from finished runs only")
    kind, name = platform()
    # Runs that differ only in lr or seed cost the same: one config each.
    groups: dict[str, list] = {}
    for run in todo:
        same = {k: v for k, v in run["overrides"].items()
                if k not in (cfg.get("lr_key"), cfg.get("seed_key"))}
        groups.setdefault(repr(sorted(same.items())), []).append(run)
    cache: dict = {}
    total, rates = 0.0, set()
    for runs in groups.values():
        config = grid.training_config(cfg["base_config"], runs[0]["overrides"])
        precision = str(config.train.get("precision", "auto"))
        if precision == "auto":
            precision = "float32" if kind == "cpu" else "bfloat16"
        rate = device_rate(kind, name, precision)
        rates.add(rate)
        total += len(runs) * run_seconds(config, rate, STARTUP_S[kind], cache)
    how = "the measured CPU rate" if kind == "cpu" else "30% of its peak"
    shown = "/".join(f"{r:.1e}" for r in sorted(rates))
    return Estimate(total, f"FLOPs at {shown} FLOP/s on {name} ({how}) plus "
                           f"{STARTUP_S[kind]:.0f} s start-up per run; small models run "
                           f"slower")


def format_seconds(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
