"""The grid of a sweep config: its runs, the slice one process takes, each run's config.

A sweep config (configs/compare_*.py) names a `task`, a train.py config (`base_config`),
`overrides` shared by every run, and the axes `settings x mixers x sizes x lrs x seeds`.
Each run is a dict of dotted `KEY: VALUE` overrides on top of `base_config`, the same
keys `train.py --config.KEY=VALUE` takes.
"""
from __future__ import annotations

import itertools
import pathlib
from typing import Any, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = ("lm", "mqar", "niah", "speed")


def flatten(d: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """{"model": {"mixer": "x"}} and {"model.mixer": "x"} both -> {"model.mixer": "x"};
    None values (unset placeholders) are dropped."""
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        elif v is None:
            continue  # an unset placeholder: leave the training config's own value
        else:
            out[f"{prefix}{k}"] = v
    return out


def _axis(cfg: Mapping, name: str, default):
    values = cfg.get(name)
    return list(values) if values else [default]


def expand_grid(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Runs of the sweep, in order: each {name, setting, mixer, size, lr, seed, overrides}.

    `settings`, `mixers` and `sizes` are lists of {"name": str, "overrides": {KEY: VALUE}};
    `lrs` and `seeds` lists of numbers written to the keys `lr_key` and `seed_key`. A mixer
    entry may carry its own "sizes", which replace the sweep's for that mixer (Zoology
    sizes the sliding window by its window at one width, the other mixers by width).
    """
    task = cfg.get("task")
    if task not in TASKS:
        raise ValueError(f"compare config: task={task!r}; choose one of {TASKS}")
    blank = {"name": "default", "overrides": {}}
    sweep_sizes = _axis(cfg, "sizes", blank)
    cells = [(setting, mixer, size)
             for setting in _axis(cfg, "settings", blank)
             for mixer in _axis(cfg, "mixers", blank)
             for size in (mixer.get("sizes") or sweep_sizes)]
    runs = []
    for (setting, mixer, size), lr, seed in itertools.product(
            cells, _axis(cfg, "lrs", None), _axis(cfg, "seeds", 0)):
        overrides = flatten(cfg.get("overrides"))
        for part in (setting, mixer, size):
            overrides.update(flatten(part.get("overrides")))
        if lr is not None:
            overrides[cfg["lr_key"]] = lr
        if task != "speed":
            overrides[cfg["seed_key"]] = seed
        parts = [setting["name"], mixer["name"], size["name"],
                 None if lr is None else f"lr{lr:g}",
                 None if task == "speed" else f"s{seed}"]
        name = "__".join(p for p in parts if p and p != "default")
        runs.append({"name": name, "setting": setting["name"], "mixer": mixer["name"],
                     "size": size["name"], "lr": lr, "seed": seed, "overrides": overrides})
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):
        raise ValueError("compare config: two grid entries share a name; give every "
                         "setting, mixer and size a distinct `name`")
    return runs


def parse_shard(text: str) -> tuple[int, int]:
    """"i/n" -> (i, n): this process takes grid entries i, i+n, i+2n, ..."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise ValueError(f"--shard={text!r}: use i/n with 0 <= i < n, e.g. 0/2 and 1/2 for "
                         "two processes")
    return i, n


def select(grid: list[dict], only: str = "", shard: str = "0/1") -> list[dict]:
    """The runs one invocation takes: names containing any comma-separated part of
    `only` (all when empty), then every n-th of those from the i-th (shard "i/n")."""
    wanted = [part for part in only.split(",") if part]
    runs = [r for r in grid if any(part in r["name"] for part in wanted)] if wanted \
        else grid
    i, n = parse_shard(shard)
    return runs[i::n]


def flag_value(v: Any) -> str:
    """A value as train.py's --config.KEY=VALUE flag reads it back."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return repr(tuple(v))
    return str(v)


def train_command(cfg: Mapping, run: Mapping, run_dir: str, python: str) -> list[str]:
    """`python train.py --config=BASE --workdir=RUN_DIR --config.KEY=VALUE ...`."""
    cmd = [python, str(ROOT / "train.py"), f"--config={ROOT / cfg['base_config']}",
           f"--workdir={run_dir}"]
    cmd += [f"--config.{k}={flag_value(v)}" for k, v in sorted(run["overrides"].items())]
    return cmd


def training_config(base_config: str, overrides: Mapping[str, Any]):
    """The locked train.py ConfigDict of one run: `base_config` (a path under the repo
    root) with `overrides` applied, each checked as train.py checks its flags."""
    from training import config_tools

    config = config_tools.load_config_file(str(ROOT / base_config))
    config_tools.check_overrides(config, {k: flag_value(v) for k, v in overrides.items()})
    config_tools.set_values(config, overrides)
    return config
