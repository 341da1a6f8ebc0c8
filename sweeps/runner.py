"""Runs a sweep: every unfinished run of the grid, one after another, with its record.

Every run trains in its own subdirectory, through `train.py` in a subprocess (a crash or
an out-of-memory in one run cannot take the sweep down, and train.py's own checkpoints
make a killed run resume) or in this process (`runner: inprocess`), is then measured
(sweeps.tasks), and leaves one record file in its directory:

  done.json     finished; a later invocation skips the run.
  partial.json  measured in part (a speed length failed or the time budget cut it): shown
                in the tables, and measured again by the next invocation.
  failed.json   raised; the error, shown in the tables; run again by the next invocation.

After every run the sweep rewrites its tables and plots (sweeps.outputs), so partial
results are always on disk.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Mapping

from eval import common
from sweeps import grid, outputs, tasks

RECORDS = ("done.json", "partial.json", "failed.json")


def _child_env(cfg: Mapping) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(grid.ROOT)]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("WANDB_MODE", "disabled")
    for k, v in dict(cfg.get("env") or {}).items():
        env[str(k)] = str(v)
    return env


def train_subprocess(cfg: Mapping, run: Mapping, run_dir: str, python: str) -> None:
    """`python train.py ...` for one run, output appended to RUN_DIR/train.log."""
    cmd = grid.train_command(cfg, run, run_dir, python)
    with open(os.path.join(run_dir, "train.log"), "a") as logf:
        logf.write("$ " + " ".join(cmd) + "\n")
        logf.flush()
        timeout = cfg.get("train_timeout_s") or None
        proc = subprocess.run(cmd, cwd=grid.ROOT, stdout=logf, stderr=subprocess.STDOUT,
                              timeout=timeout, env=_child_env(cfg))
    if proc.returncode != 0:
        tail = pathlib.Path(run_dir, "train.log").read_text()[-1500:]
        raise RuntimeError(f"train.py exited with {proc.returncode}; end of "
                           f"{run_dir}/train.log:\n{tail}")


def train_inprocess(cfg: Mapping, run: Mapping, run_dir: str) -> None:
    """The same training through `training.loop.train` in this process.

    Saves the interpreter start and device initialisation per run (seconds on a GPU),
    at the price of isolation; a kill (SIGINT/SIGTERM) stops the sweep, not just the run.
    """
    from training import loop

    config = grid.training_config(cfg["base_config"], run["overrides"])
    if "logging.progress" not in run["overrides"] and "progress" in config.logging:
        config.logging.progress = False  # the sweep has its own bar
    try:
        loop.train(config, run_dir)
    except loop.Interrupted as e:
        raise KeyboardInterrupt(f"{run['name']}: {e}") from e


def do_run(cfg: Mapping, run: Mapping, workdir: str, python: str, deadline: float | None,
           log) -> dict[str, Any]:
    """Trains (unless task == speed) and measures one run; returns its record."""
    task = cfg["task"]
    run_dir = os.path.join(workdir, run["name"])
    os.makedirs(run_dir, exist_ok=True)
    t0 = time.time()
    if task == "speed":
        rec = tasks.run_speed(cfg, run, deadline, log)
    else:
        if cfg.get("runner", "subprocess") == "inprocess":
            train_inprocess(cfg, run, run_dir)
        else:
            train_subprocess(cfg, run, run_dir, python)
        train_wall = time.time() - t0
        rec = tasks.evaluate_run(task, run_dir, dict(cfg.get("eval") or {}))
        logged = tasks.read_train_log(run_dir)
        if "curve" in logged:
            rec["metrics"]["curve"] = logged["curve"]
            rec["metrics"]["best_val_loss"] = logged["best_val_loss"]
        rec["tokens_per_s"] = logged.get("tokens_per_s")
        rec["train_wall_s"] = train_wall
    rec.update({"run": run["name"], "task": task, "setting": run["setting"],
                "mixer": run["mixer"], "size": run["size"], "lr": run["lr"],
                "seed": run["seed"], "steps": rec.pop("step"), "wall_s": time.time() - t0,
                "overrides": run["overrides"]})
    return rec


def keep_record(run_dir: str, name: str, record: Mapping) -> None:
    """Writes RUN_DIR/NAME (one of RECORDS) and removes the run's other record files, so
    a run directory always says one thing about its run."""
    for other in RECORDS:
        if other != name and os.path.exists(os.path.join(run_dir, other)):
            os.remove(os.path.join(run_dir, other))
    common.write_json(os.path.join(run_dir, name), record)


def sweep(cfg: Mapping[str, Any], workdir: str, *, python: str = sys.executable,
          max_wall_s: float = 0.0, only: str = "", progress: bool = True,
          shard: str = "0/1", report_only: bool = False) -> list[dict]:
    """Runs every unfinished run of the grid, one after another; returns all records.

    shard "i/n": run only every n-th grid entry from the i-th, so n processes (on one GPU
    or several) share a sweep directory.
    only: run only grid entries whose name contains it, or (comma-separated) any of them.
    report_only: run nothing, rebuild results.jsonl / results.md / plots.
    The tables and plots cover every finished run of the grid, whatever only/shard say
    (other invocations may have run the rest).
    """
    full = grid.expand_grid(cfg)
    mine = grid.select(full, only, shard)
    os.makedirs(workdir, exist_ok=True)
    if report_only:
        return outputs.write_outputs(cfg, full, workdir)
    deadline = time.time() + max_wall_s if max_wall_s else None
    todo = [r for r in mine
            if not os.path.isfile(os.path.join(workdir, r["name"], "done.json"))]
    from tqdm import tqdm

    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="sweep", unit="run",
               disable=not progress)
    log = bar.write
    for run in todo:
        if deadline is not None and time.time() > deadline:
            log(f"sweep: time budget of {max_wall_s:.0f}s spent; {run['name']} and later "
                "runs are left for the next invocation")
            break
        bar.set_postfix_str(run["name"][:60])
        run_dir = os.path.join(workdir, run["name"])
        try:
            rec = do_run(cfg, run, workdir, python, deadline, log)
        except Exception as e:  # noqa: BLE001 (one failed run must not stop the sweep)
            os.makedirs(run_dir, exist_ok=True)
            common.write_json(os.path.join(run_dir, "failed.json"),
                              {"error": f"{type(e).__name__}: {e}"})
            log(f"sweep: {run['name']} FAILED: {type(e).__name__}: {str(e)[:500]}")
        else:
            if rec.get("partial"):
                # shown, but measured again by the next invocation (the loop's deadline
                # check stops the sweep when the budget is spent)
                keep_record(run_dir, "partial.json", rec)
                log(f"sweep: {run['name']}: {rec['partial']}; kept as partial.json, "
                    "redone by the next invocation")
            else:
                keep_record(run_dir, "done.json", rec)
                metrics = {k: v for k, v in rec["metrics"].items()
                           if isinstance(v, (int, float))}
                log(f"sweep: {run['name']} done in {rec['wall_s']:.0f}s: {metrics}")
        outputs.write_outputs(cfg, full, workdir)
        bar.update(1)
    bar.close()
    return outputs.write_outputs(cfg, full, workdir)
