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

Stopping: SIGINT (Ctrl-C) or SIGTERM to the sweep is passed to the run in progress,
which saves a checkpoint and exits (train.py's own handling); the sweep then writes its
tables and stops with SweepInterrupted (sweeps.run: one line, exit 128 + the signal), and
the same command resumes the run from its checkpoint. A child runs in its own process
group, so a terminal's Ctrl-C reaches it once, through the sweep; a child whose sweep
dies without a word (SIGKILL) gets SIGTERM through sweeps/child_guard.py (the kernel's
PR_SET_PDEATHSIG on Linux), saves and exits: no run outlives its sweep. A second signal to the sweep is passed on
too (train.py then stops without saving) and the sweep stops at once. Before the first
run the sweep prints its run count and an estimate of its time (sweeps.estimate).
"""
from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any, Iterator, Mapping

from eval import common
from sweeps import estimate, grid, outputs, tasks

RECORDS = ("done.json", "partial.json", "failed.json")
# A run that outlives its train_timeout_s is sent SIGTERM (it saves) and given this long
# to exit before SIGKILL.
TERM_GRACE_S = 120.0


class SweepInterrupted(BaseException):
    """SIGINT/SIGTERM reached the sweep; the run in progress saved and stopped. A
    BaseException, as KeyboardInterrupt: no `except Exception` (a failed run's record)
    takes it for a failure."""

    def __init__(self, signum: int, run: str | None):
        where = f"; {run} saved its checkpoint" if run else ""
        super().__init__(f"sweep stopped by {signal.Signals(signum).name}{where}. Run the "
                         "same command to resume")
        self.signum, self.run = signum, run


class _Stop:
    """The sweep's SIGINT/SIGTERM handler: the first signal is passed to the running child
    (which saves and exits) and remembered; with no child (measuring, writing tables) it
    stops the sweep at once. A second signal is passed on and stops the sweep."""

    def __init__(self):
        self.signum: int | None = None
        self.child: subprocess.Popen | None = None
        self.run: str | None = None

    def handle(self, signum, frame):
        first = self.signum is None
        self.signum = signum if first else self.signum
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)
            if first:
                print(f"\nsweep: {signal.Signals(signum).name}: passed to {self.run}, "
                      "which saves a checkpoint and exits (again to stop without saving)",
                      file=sys.stderr, flush=True)
                return
        # The interrupt may land inside an asyncio loop (orbax restoring a member to
        # evaluate it): every task it cancels would log its traceback at shutdown, a
        # wall of errors that are only this stop. _signals_passed_on restores the level.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        raise SweepInterrupted(self.signum, None)


_STOP: _Stop | None = None


@contextlib.contextmanager
def _signals_passed_on() -> Iterator[_Stop]:
    global _STOP
    stop, previous = _Stop(), {}
    asyncio_level = logging.getLogger("asyncio").level
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, stop.handle)
        except ValueError:  # not the main thread: signals stay as they are
            pass
    _STOP = stop
    try:
        yield stop
    finally:
        _STOP = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.getLogger("asyncio").setLevel(asyncio_level)


# Each subprocess run is started through this script (see its docstring): the run gets
# one SIGTERM, and saves, when the sweep dies.
CHILD_GUARD = pathlib.Path(__file__).with_name("child_guard.py")


def _child_env(cfg: Mapping) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(grid.ROOT)]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("WANDB_MODE", "disabled")
    for k, v in dict(cfg.get("env") or {}).items():
        env[str(k)] = str(v)
    return env


def train_subprocess(cfg: Mapping, run: Mapping, run_dir: str, python: str) -> None:
    """`python train.py ...` for one run, output appended to RUN_DIR/train.log. The child
    has its own process group and dies with the sweep; a signal to the sweep reaches it
    through _Stop (it saves, and SweepInterrupted follows)."""
    run_guarded(cfg, grid.train_command(cfg, run, run_dir, python),
                os.path.join(run_dir, "train.log"), run["name"], python, what="train.py")


def run_guarded(cfg: Mapping, cmd: list[str], log_path: str, name: str, python: str, *,
                what: str) -> None:
    """Runs a training command (train.py, a population) for the sweep: through the child
    guard (it never outlives the sweep), in its own process group, output appended to
    `log_path`; a signal to the sweep reaches it through _Stop (it saves) and
    SweepInterrupted(name) follows; past train_timeout_s it gets SIGTERM, then SIGKILL;
    a non-zero exit is a RuntimeError quoting the log's end (`what` names the program)."""
    stop = _STOP
    with open(log_path, "a") as logf:
        logf.write("$ " + " ".join(cmd) + "\n")
        logf.flush()
        timeout = cfg.get("train_timeout_s") or None
        guarded = [python, str(CHILD_GUARD), str(os.getpid())] + cmd
        proc = subprocess.Popen(guarded, cwd=grid.ROOT, stdout=logf,
                                stderr=subprocess.STDOUT, env=_child_env(cfg),
                                process_group=0)
        if stop is not None:
            stop.child, stop.run = proc, name
        try:
            _wait(proc, timeout, logf)
        finally:
            if stop is not None:
                stop.child = None
            if proc.poll() is None:  # the sweep stops at once (second signal, error)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if stop is not None and stop.signum is not None:
        raise SweepInterrupted(stop.signum, name)
    if proc.returncode != 0:
        tail = pathlib.Path(log_path).read_text()[-1500:]
        raise RuntimeError(f"{what} exited with {proc.returncode}; end of "
                           f"{log_path}:\n{tail}")


def _wait(proc: subprocess.Popen, timeout: float | None, logf) -> None:
    """Until the child exits; past `timeout` it is sent SIGTERM (it saves), then SIGKILL
    after TERM_GRACE_S."""
    try:
        proc.wait(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    logf.write(f"sweep: train_timeout_s={timeout} passed: SIGTERM\n")
    logf.flush()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    raise subprocess.TimeoutExpired(proc.args, timeout)


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
        loop.train(config, run_dir)  # its own SIGINT/SIGTERM handler while it trains
    except loop.Interrupted as e:
        raise SweepInterrupted(e.signum, run["name"]) from None


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
        start_step = tasks.saved_step(run_dir)
        if cfg.get("runner", "subprocess") == "inprocess":
            train_inprocess(cfg, run, run_dir)
        else:
            train_subprocess(cfg, run, run_dir, python)
        rec = tasks.trained_record(task, run_dir, dict(cfg.get("eval") or {}),
                                   time.time() - t0, start_step)
    return tasks.with_run_fields(rec, run, task, time.time() - t0)


def keep_record(run_dir: str, name: str, record: Mapping) -> None:
    """Writes RUN_DIR/NAME (one of RECORDS) and removes the run's other record files, so
    a run directory always says one thing about its run."""
    for other in RECORDS:
        if other != name and os.path.exists(os.path.join(run_dir, other)):
            os.remove(os.path.join(run_dir, other))
    common.write_json(os.path.join(run_dir, name), record)


def _name_records_outside(records: Mapping[str, dict], runs: list[dict]) -> None:
    """One stderr line for --records' records of runs this grid does not have (another
    seed or lr, say): the tables leave them out, and the line says which axis to widen."""
    names = {r["name"] for r in runs}
    outside = [rec for name, rec in records.items() if name not in names]
    if not outside:
        return
    def lacking(key):  # values of `key` in those records that no grid run has
        return sorted({rec.get(key) for rec in outside} - {r[key] for r in runs} - {None},
                      key=str)
    seeds, lrs = lacking("seed"), lacking("lr")
    hint = "; ".join(part for part in (
        seeds and f"seeds {', '.join(map(str, seeds))} (--config.seeds=...)",
        lrs and f"lrs {', '.join(map(str, lrs))} (--config.lrs=...)") if part)
    print(f"sweep: {len(outside)} of --records' records are of runs outside this grid, "
          f"left out of the tables (e.g. {outside[0].get('run')})"
          + (f"; the grid lacks {hint}" if hint else ""), file=sys.stderr, flush=True)


def sweep(cfg: Mapping[str, Any], workdir: str, *, python: str = sys.executable,
          max_wall_s: float = 0.0, only: str = "", progress: bool = True,
          shard: str = "0/1", report_only: bool = False, confirm=None,
          records_from: tuple[str, ...] = ()) -> list[dict]:
    """Runs every unfinished run of the grid, one after another; returns all records.

    shard "i/n": run only every n-th grid entry from the i-th, so n processes (on one GPU
    or several) share a sweep directory.
    only: run only grid entries whose name contains it, or (comma-separated) any of them.
    report_only: run nothing, rebuild results.jsonl / results.md / plots; records_from
      (paths of results.jsonl files, e.g. other copies of this sweep) then supplies the
      grid's runs that have no record file in workdir (a later file wins a run).
    confirm: called with the time estimate before the first run; False runs nothing.
    The tables and plots cover every finished run of the grid, whatever only/shard say
    (other invocations may have run the rest).
    """
    if cfg.get("population") and not report_only:
        from sweeps import populations  # each cell's lrs x seeds as one population
        return populations.sweep(cfg, workdir, python=python, max_wall_s=max_wall_s,
                                 only=only, progress=progress, shard=shard)
    full = grid.expand_grid(cfg)
    mine = grid.select(full, only, shard)
    os.makedirs(workdir, exist_ok=True)
    if report_only:
        extra = {}
        for path in records_from:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"--records: no file {path}")
            extra.update(outputs.records_file(path))
        _name_records_outside(extra, full)
        return outputs.write_outputs(cfg, full, workdir, extra)
    deadline = time.time() + max_wall_s if max_wall_s else None
    todo = [r for r in mine
            if not os.path.isfile(os.path.join(workdir, r["name"], "done.json"))]
    est = announce(cfg, full, mine, todo, workdir)
    if todo and confirm is not None and not confirm(est):
        print("sweep: nothing run", file=sys.stderr, flush=True)
        return outputs.write_outputs(cfg, full, workdir)
    with _signals_passed_on():
        return _run_all(cfg, full, mine, todo, workdir, python, deadline, max_wall_s,
                        progress)


def announce(cfg: Mapping, full: list[dict], mine: list[dict], todo: list[dict],
             workdir: str, out=None) -> estimate.Estimate:
    """The sweep's first line: its run count and time estimate."""
    est = estimate.estimate(cfg, full, todo, workdir)
    done = len(mine) - len(todo)
    of = f" of the grid's {len(full)}" if len(mine) != len(full) else ""
    when = ("time not estimated" if est.seconds is None
            else f"about {estimate.format_seconds(est.seconds)}")
    runs = f"{len(mine)} run" + ("" if len(mine) == 1 else "s")
    print(f"sweep: {runs}{of} ({cfg['task']}), {len(todo)} to run"
          + (f", {done} finished already" if done else "")
          + f"; {when} ({est.basis})", file=out or sys.stderr, flush=True)
    return est


def _run_all(cfg, full, mine, todo, workdir, python, deadline, max_wall_s, progress):
    from tqdm import tqdm

    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="sweep", unit="run",
               disable=not progress)
    log = bar.write
    try:
        _run_each(cfg, full, todo, workdir, python, deadline, max_wall_s, bar, log)
    except SweepInterrupted:
        outputs.write_outputs(cfg, full, workdir)  # what finished is in the tables
        raise
    finally:
        bar.close()
    return outputs.write_outputs(cfg, full, workdir)


def _run_each(cfg, full, todo, workdir, python, deadline, max_wall_s, bar, log):
    t0 = time.time()
    for k, run in enumerate(todo):
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
        left = len(todo) - k - 1
        if left:
            mean = (time.time() - t0) / (k + 1)
            log(f"sweep: {k + 1} of {len(todo)} runs done; about "
                f"{estimate.format_seconds(mean * left)} left ({left} runs)")
