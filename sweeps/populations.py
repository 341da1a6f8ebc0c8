"""A sweep whose grid cells train as populations: the runs of one (setting, mixer, size)
differ only in lr and seed, so they train together in one program (training.population,
members vmapped) instead of one after another; `population: True` in the sweep config.

    WORKDIR/<cell>/                      the population (population.json, its lock)
    WORKDIR/<cell>/lr{lr}_seed{seed}/    each member: a train.py workdir
    WORKDIR/<run>/done.json              each run's record, as a separate run's (below)

Every run still gets its own record in WORKDIR/<run name>/ (done.json, or failed.json
for a member that diverged or a population that failed), measured on its member's
workdir exactly as sweeps.runner measures a separate run's (sweeps.tasks), plus
`member_dir` and `population` (the cell and its member count), so results.jsonl, the
tables, the plots and publishing read a population sweep as they read any other.
`train_wall_s` of a member is its population's wall time in this invocation, shared by
`population.members` runs; a population that resumed its members from step N > 0 (an
earlier invocation stopped it) records `resumed_from_step` N, so a member trained in a
population of three and evaluated after a resume reads as such, not as a short run.

Stopping and resuming, as sweeps.runner does for a run: SIGINT/SIGTERM to the sweep is
passed to the population in progress (a subprocess through runner's child guard, or
in-process through training.population's own handler): every member saves, the sweep
writes its tables and stops with SweepInterrupted. A second invocation skips runs with
done.json and trains the rest of each cell as one population, which resumes its members
from their checkpoints. Members of one
cell at different steps (a grid or --only changed between invocations) cannot share a
population (they would have to step together): they are trained as one population per
step they stand at, largest step first. --shard splits the grid by cells.

Memory: a population that runs out of memory (XLA's RESOURCE_EXHAUSTED) is tried again
as two populations of half its size, one after the other, and so on down to one member,
which is then recorded as failed; `population_max_members` in the sweep config sets the
largest population from the start (no failed attempts to compile and allocate first).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any, Callable, Mapping

from sweeps import grid, tasks

# The training entry point of a population, as a module (python -m training.population).
POPULATION_MODULE = "training.population"


def cell_name(run: Mapping) -> str:
    """The name of a run's cell: its name without the lr and seed parts."""
    parts = [run["setting"], run["mixer"], run["size"]]
    return "__".join(p for p in parts if p and p != "default") or "default"


def cells(runs: list[dict], cfg: Mapping) -> list[dict]:
    """The runs grouped by cell, in grid order: [{name, runs, overrides}] where overrides
    are the cell's shared ones (the runs' overrides without the lr and seed keys)."""
    drop = {cfg.get("lr_key"), cfg.get("seed_key")}
    out: dict[str, dict] = {}
    for r in runs:
        shared = {k: v for k, v in r["overrides"].items() if k not in drop}
        c = out.setdefault(cell_name(r), {"name": cell_name(r), "runs": [],
                                          "overrides": shared})
        if shared != c["overrides"]:  # a grid where lr/seed are not all that varies
            raise ValueError(f"population sweep: runs of cell {c['name']} differ in more "
                             f"than {cfg.get('lr_key')} and {cfg.get('seed_key')}")
        c["runs"].append(r)
    return list(out.values())


def check_config(cfg: Mapping) -> None:
    """A population varies train.lr and train.seed and trains a model: say so if the
    sweep config asks for something else."""
    if cfg.get("task") == "speed":
        raise ValueError("population: True needs a task that trains (lm, mqar, niah); "
                         "the speed task trains nothing")
    if cfg.get("lr_key") != "train.lr" or cfg.get("seed_key") != "train.seed":
        raise ValueError(f"population: True trains members that differ in train.lr and "
                         f"train.seed; this sweep varies lr_key={cfg.get('lr_key')!r}, "
                         f"seed_key={cfg.get('seed_key')!r}")
    if any(r.get("lr") is None for r in grid.expand_grid(cfg)):
        raise ValueError("population: True needs the sweep's `lrs` (one or more)")
    limit = cfg.get("population_max_members") or 0
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"population_max_members={limit!r}: the most members a "
                         "population may have, a whole number >= 1 (0: no limit)")


def select(full: list[dict], cfg: Mapping, only: str = "",
           shard: str = "0/1") -> list[dict]:
    """The runs one invocation takes: those whose name contains a part of `only` (all
    when empty), then every n-th CELL of those from the i-th (shard "i/n"), so that no
    cell is split between processes."""
    wanted = [part for part in only.split(",") if part]
    runs = [r for r in full if any(p in r["name"] for p in wanted)] if wanted else full
    i, n = grid.parse_shard(shard)
    return [r for c in cells(runs, cfg)[i::n] for r in c["runs"]]


def member_dir(workdir: str, run: Mapping) -> pathlib.Path:
    from training.population import member_name

    return pathlib.Path(workdir) / cell_name(run) / member_name(run["lr"], run["seed"])


def groups(cell_runs: list[dict], workdir: str, max_members: int = 0) -> list[list[dict]]:
    """The populations to train for one cell's unfinished runs: the members at one saved
    step together (largest step first), each group split into lrs x seeds products
    (training.population trains products): the lrs that lack the same seeds train
    together, e.g. 1e-4 with seed 2 alone beside the other lrs with seeds 0-2. With
    max_members > 0 (the sweep's population_max_members) a product larger than that is
    cut into products of at most max_members, so that a cell whose 12 members do not fit
    in a GPU's memory trains as populations one after another."""
    by_step: dict[int, list[dict]] = {}
    for r in cell_runs:
        by_step.setdefault(tasks.saved_step(member_dir(workdir, r)), []).append(r)
    out = []
    for step in sorted(by_step, reverse=True):
        rs = by_step[step]
        seeds_of: dict[Any, tuple] = {}
        for r in rs:
            seeds_of[r["lr"]] = seeds_of.get(r["lr"], ()) + (r["seed"],)
        lrs_of: dict[tuple, list] = {}
        for lr, seeds in seeds_of.items():
            lrs_of.setdefault(seeds, []).append(lr)
        for lrs in lrs_of.values():
            out += _split_product([r for r in rs if r["lr"] in lrs], max_members)
    return out


def _split_product(runs: list[dict], max_members: int) -> list[list[dict]]:
    """Runs that form an lrs x seeds product, cut into products of at most max_members
    runs (0: the whole product), each run in one. An lr's seeds stay together where they
    fit, so that a sweep stopped between populations leaves lrs with all their seeds (a
    table point is an lr's mean over its seeds) rather than every lr with some."""
    if max_members <= 0 or len(runs) <= max_members:
        return [runs]
    lrs = list(dict.fromkeys(r["lr"] for r in runs))
    seeds = list(dict.fromkeys(r["seed"] for r in runs))
    per_seeds = min(len(seeds), max_members)
    per_lrs = max(1, max_members // per_seeds)
    return [[r for r in runs if r["lr"] in lrs[i:i + per_lrs]
             and r["seed"] in seeds[j:j + per_seeds]]
            for i in range(0, len(lrs), per_lrs)
            for j in range(0, len(seeds), per_seeds)]


def population_command(cfg: Mapping, overrides: Mapping, cell_dir: str, lrs, seeds,
                       python: str) -> list[str]:
    """`python -m training.population --config=BASE --workdir=CELL --lrs=.. --seeds=..
    --config.KEY=VALUE ...`: the cell's shared overrides, as train.py's flags."""
    cmd = [python, "-m", POPULATION_MODULE, f"--config={grid.ROOT / cfg['base_config']}",
           f"--workdir={cell_dir}", "--lrs=" + ",".join(repr(float(x)) for x in lrs),
           "--seeds=" + ",".join(str(int(s)) for s in seeds)]
    cmd += [f"--config.{k}={grid.flag_value(v)}" for k, v in sorted(overrides.items())]
    return cmd


def train_subprocess(cfg: Mapping, cmd: list[str], log_path: str, name: str,
                     python: str) -> None:
    """Runs the population command as sweeps.runner runs train.py (runner.run_guarded):
    through its child guard (the population never outlives the sweep), in its own
    process group, output appended to `log_path`; a signal to the sweep reaches it
    (every member saves) and SweepInterrupted follows; past train_timeout_s (per
    training process: a population of any size) it gets SIGTERM, then SIGKILL."""
    from sweeps import runner

    runner.run_guarded(cfg, cmd, log_path, f"population {name}", python,
                       what="the population")


def train_inprocess(cfg: Mapping, overrides: Mapping, cell_dir: str, lrs, seeds) -> None:
    """The same population through training.population in this process."""
    from sweeps import runner
    from training import loop, population

    config = grid.training_config(cfg["base_config"], overrides)
    if "logging.progress" not in overrides and "progress" in config.logging:
        config.logging.progress = False  # the sweep has its own bar
    try:
        population.train_population(config, cell_dir, lrs, seeds)  # its own handler
    except loop.Interrupted as e:
        raise runner.SweepInterrupted(
            e.signum, f"population {os.path.basename(cell_dir)}") from None


def diverged(cell_dir: str) -> dict[str, int]:
    """{member name: step} of the members the population froze as non-finite."""
    from training import population

    path = pathlib.Path(cell_dir) / population.POPULATION_FILE
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("diverged", {}))


def measure(cfg: Mapping, run: Mapping, workdir: str, train_wall: float, members: int,
            started: float, resumed_from_step: int = 0) -> dict[str, Any]:
    """A member's record: what sweeps.runner.do_run records for a separate run (the
    task's metrics, loss curve, best val loss, tokens/s, the grid fields, the step its
    training resumed from), measured on the member's workdir; plus member_dir and
    population."""
    task = cfg["task"]
    mdir = member_dir(workdir, run)
    rec = tasks.trained_record(task, str(mdir), dict(cfg.get("eval") or {}), train_wall,
                               resumed_from_step)
    tasks.with_run_fields(rec, run, task, time.time() - started)
    rec.update({"member_dir": os.path.relpath(mdir, workdir),
                "population": {"cell": cell_name(run), "members": members}})
    return rec


def sweep(cfg: Mapping[str, Any], workdir: str, *, python: str = sys.executable,
          max_wall_s: float = 0.0, only: str = "", progress: bool = True,
          shard: str = "0/1") -> list[dict]:
    """sweeps.runner.sweep for a config with `population: True`: the unfinished runs of
    this invocation's cells (select()) trained cell by cell, then the tables and plots of
    the whole grid; returns all records."""
    from sweeps import outputs, runner

    check_config(cfg)
    full = grid.expand_grid(cfg)
    mine = select(full, cfg, only, shard)
    os.makedirs(workdir, exist_ok=True)
    deadline = time.time() + max_wall_s if max_wall_s else None
    todo = [r for r in mine
            if not os.path.isfile(os.path.join(workdir, r["name"], "done.json"))]
    n_cells = len(cells(todo, cfg))
    print(f"sweep: {len(mine)} runs in {len(cells(mine, cfg))} populations "
          f"({cfg['task']}), {len(todo)} runs in {n_cells} to train", file=sys.stderr,
          flush=True)
    from tqdm import tqdm

    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="sweep", unit="run",
               disable=not progress)
    try:
        with runner._signals_passed_on():  # Ctrl-C / SIGTERM: the population saves
            run_cells(cfg, todo, workdir, python=python, deadline=deadline,
                      max_wall_s=max_wall_s, log=bar.write, done=lambda r: bar.update(1),
                      keep_record=runner.keep_record,
                      write_outputs=lambda: outputs.write_outputs(cfg, full, workdir))
    except runner.SweepInterrupted:
        outputs.write_outputs(cfg, full, workdir)  # what finished is in the tables
        raise
    finally:
        bar.close()
    return outputs.write_outputs(cfg, full, workdir)


def run_cells(cfg: Mapping, todo: list[dict], workdir: str, *, python: str,
              deadline: float | None, max_wall_s: float, log,
              done: Callable[[dict], None],
              keep_record: Callable[[str, str, Mapping], None], write_outputs: Callable[[], Any]) -> None:
    """Trains the unfinished runs `todo` cell by cell, one population per group
    (groups()), then measures and records each member. `done(run)` is called once per
    run recorded (the progress bar); keep_record / write_outputs: sweeps.runner's and
    sweeps.outputs'."""
    max_members = int(cfg.get("population_max_members") or 0)
    for cell in cells(todo, cfg):
        pending = groups(cell["runs"], workdir, max_members)
        while pending:
            members = pending.pop(0)
            if deadline is not None and time.time() > deadline:
                log(f"sweep: time budget of {max_wall_s:.0f}s spent; population "
                    f"{cell['name']} and later ones are left for the next invocation")
                return
            if _run_group(cfg, cell, members, workdir, python, log, done, keep_record,
                          halve_if_out_of_memory=len(members) > 1):
                parts = halves(members)  # each resumes where its members saved
                log(f"sweep: population {cell['name']} ran out of memory with "
                    f"{len(members)} members; next: populations of "
                    f"{' + '.join(str(len(part)) for part in parts)}")
                pending = parts + pending
            write_outputs()


def halves(members: list[dict]) -> list[list[dict]]:
    """A population's runs as lrs x seeds products of at most half its size (rounded
    up): what is tried after it ran out of memory."""
    return _split_product(members, (len(members) + 1) // 2)


def out_of_memory(error: BaseException) -> bool:
    """Whether a population failed for want of accelerator or host memory (XLA's
    RESOURCE_EXHAUSTED, in-process or quoted from a subprocess's log)."""
    text = str(error)
    return (isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text
            or "Out of memory while trying to allocate" in text)


def _run_group(cfg, cell, members, workdir, python, log, done, keep_record,
               halve_if_out_of_memory=False) -> bool:
    """Trains one population and records its members; True (nothing recorded) where it
    ran out of memory and halve_if_out_of_memory says to try smaller ones instead."""
    cell_dir = os.path.join(workdir, cell["name"])
    os.makedirs(cell_dir, exist_ok=True)
    lrs = list(dict.fromkeys(r["lr"] for r in members))
    seeds = list(dict.fromkeys(r["seed"] for r in members))
    start_step = tasks.saved_step(member_dir(workdir, members[0]))  # groups(): shared
    t0 = time.time()
    log(f"sweep: population {cell['name']}: {len(lrs)} lrs x {len(seeds)} seeds")
    try:
        if cfg.get("runner", "subprocess") == "inprocess":
            train_inprocess(cfg, cell["overrides"], cell_dir, lrs, seeds)
        else:
            cmd = population_command(cfg, cell["overrides"], cell_dir, lrs, seeds, python)
            train_subprocess(cfg, cmd, os.path.join(cell_dir, "population.log"),
                             cell["name"], python)
    except Exception as e:  # noqa: BLE001 (one failed population must not stop the sweep)
        if halve_if_out_of_memory and out_of_memory(e):
            return True
        for r in members:
            run_dir = os.path.join(workdir, r["name"])
            os.makedirs(run_dir, exist_ok=True)
            keep_record(run_dir, "failed.json",
                        {"error": f"population {cell['name']}: {type(e).__name__}: {e}"})
            done(r)
        log(f"sweep: population {cell['name']} FAILED: {type(e).__name__}: {str(e)[:500]}")
        return False
    train_wall = time.time() - t0
    gone = diverged(cell_dir)
    from training.population import member_name
    for r in members:
        run_dir = os.path.join(workdir, r["name"])
        os.makedirs(run_dir, exist_ok=True)
        name = member_name(r["lr"], r["seed"])
        try:
            if name in gone:
                raise RuntimeError(f"loss or parameters non-finite at step {gone[name]} "
                                   f"(population member {cell['name']}/{name}, frozen "
                                   "there)")
            rec = measure(cfg, r, workdir, train_wall, len(members), t0, start_step)
        except Exception as e:  # noqa: BLE001
            keep_record(run_dir, "failed.json", {"error": f"{type(e).__name__}: {e}"})
            log(f"sweep: {r['name']} FAILED: {type(e).__name__}: {str(e)[:300]}")
        else:
            keep_record(run_dir, "done.json", rec)
            metrics = {k: v for k, v in rec["metrics"].items()
                       if isinstance(v, (int, float))}
            resumed = f", resumed from step {start_step}" if start_step else ""
            log(f"sweep: {r['name']} done (population of {len(members)}, "
                f"{train_wall:.0f}s{resumed}): {metrics}")
        done(r)
    return False
