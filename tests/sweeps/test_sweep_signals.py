"""Sweeps that stop cleanly: SIGINT / SIGTERM to `python -m sweeps.run` reach the run in
progress, which saves a checkpoint; the sweep exits with one line and the same command
resumes the run, to the losses of a run never stopped; a SIGKILLed sweep's run saves and
exits by itself (sweeps/child_guard.py); the in-process runner stops the same way. A
sweep prints its run count and a time estimate first, and asks before a long one.

The end-to-end cases are slow (a tiny MQAR run of 3,000 steps each, about 20-30 s);
the announcement and estimate tests are fast."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from sweeps import estimate, grid, runner
from tests.eval.conftest import load_compare_config
from tests.training.conftest import ROOT, env

RUN = "T32_kv2__softmax__d16__lr0.001__s0"


def sweep_command(workdir, runner_kind="subprocess"):
    return [sys.executable, "-m", "sweeps.run", "--config=configs/compare_mqar.py:tiny",
            f"--workdir={workdir}", "--only=softmax__d16__lr0.001",
            f"--runner={runner_kind}", "--config.overrides.train.steps=3000"]


def losses(run_dir) -> dict[int, float]:
    out = {}
    for line in (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        if "loss" in e:
            out[e["step"]] = e["loss"]
    return out


def start_and_wait_for_training(workdir, runner_kind="subprocess"):
    """The sweep, once its run has logged step 20 (so it is inside the training loop)."""
    proc = subprocess.Popen(sweep_command(workdir, runner_kind), cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = pathlib.Path(workdir) / RUN / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and max(losses(metrics.parent), default=0) >= 20):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.1)
    return proc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def saved_steps(run_dir) -> list[int]:
    return sorted(int(p.name) for p in (pathlib.Path(run_dir) / "checkpoints").iterdir()
                  if p.name.isdigit())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_sweep_saves_its_run_and_the_same_command_resumes(tmp_path, sig):
    work = tmp_path / "sweep"
    proc = start_and_wait_for_training(work)
    child = json.loads((work / RUN / "lock").read_text())["pid"]  # the run's train.py
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == (f"sweep stopped by {sig.name}; {RUN} saved its checkpoint. Run the "
                    "same command to resume.")
    assert not alive(child)  # no run outlives its sweep
    log = (work / RUN / "train.log").read_text()
    stopped = int(log.split(f"stopped by {sig.name} at step ")[1].split(";")[0])
    assert saved_steps(work / RUN) == [stopped] and 20 <= stopped < 3000
    assert not (work / RUN / "failed.json").exists()  # a stop is not a failure
    if sig != signal.SIGINT:
        return
    # The same command resumes the run, to the losses of one never stopped.
    r = subprocess.run(sweep_command(work), cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming from step {stopped}" in (work / RUN / "train.log").read_text()
    assert json.loads((work / RUN / "done.json").read_text())["resumed_from_step"] == stopped
    assert "1 to run" in r.stderr.splitlines()[0]
    ref = tmp_path / "never_stopped"
    r = subprocess.run(sweep_command(ref), cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert losses(work / RUN) == losses(ref / RUN)
    assert json.loads((ref / RUN / "done.json").read_text())["resumed_from_step"] == 0


@pytest.mark.slow
def test_a_killed_sweeps_run_saves_and_exits_by_itself(tmp_path):
    work = tmp_path / "sweep"
    proc = start_and_wait_for_training(work)
    child = json.loads((work / RUN / "lock").read_text())["pid"]
    proc.kill()  # SIGKILL: the sweep can do nothing
    proc.communicate()
    deadline = time.time() + 120
    while alive(child):
        assert time.time() < deadline, "the run outlived its sweep"
        time.sleep(0.2)
    log = (work / RUN / "train.log").read_text()
    assert "SIGTERM received" in log and "checkpoint saved" in log
    stopped = int(log.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert saved_steps(work / RUN) == [stopped]
    assert not (work / RUN / "lock").exists()


@pytest.mark.slow
def test_the_inprocess_runner_saves_on_sigterm(tmp_path):
    work = tmp_path / "sweep"
    proc = start_and_wait_for_training(work, "inprocess")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"sweep stopped by SIGTERM; {RUN} saved")
    assert len(saved_steps(work / RUN)) == 1 and not (work / RUN / "failed.json").exists()


# ------------------------------------------------------------- count and estimate
def test_a_stop_inside_an_asyncio_loop_is_one_exception_not_a_log_of_its_tasks(caplog):
    """SIGTERM while the sweep evaluates in-process, inside an asyncio loop (orbax
    restoring a member): SweepInterrupted, without one logged traceback per task the
    stop cancels (a call's log held thousands); the asyncio logger's level comes back."""
    import asyncio
    import logging

    async def read(i):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError(f"reading array {i}") from None

    async def restore():
        reads = [asyncio.ensure_future(read(i)) for i in range(4)]
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.gather(*reads)

    level = logging.getLogger("asyncio").level
    with caplog.at_level(logging.WARNING):
        with pytest.raises(runner.SweepInterrupted, match="SIGTERM"):
            with runner._signals_passed_on():
                asyncio.run(restore())
        assert [r for r in caplog.records
                if r.name == "asyncio" and r.levelno >= logging.WARNING] == []
    assert logging.getLogger("asyncio").level == level


def test_the_sweep_says_its_run_count_and_estimate_first(tmp_path, capsys):
    cfg = load_compare_config("compare_mqar", "tiny")
    full = grid.expand_grid(cfg)
    mine = grid.select(full, "softmax")
    est = runner.announce(cfg, full, mine, mine, str(tmp_path))
    line = capsys.readouterr().err.strip()
    assert line.startswith("sweep: 2 runs of the grid's 4 (mqar), 2 to run; about ")
    assert "FLOP/s on cpu" in line and est.seconds > 2 * estimate.STARTUP_S["cpu"]
    # With finished runs, their measured mean.
    done = tmp_path / mine[0]["name"]
    done.mkdir()
    (done / "done.json").write_text(json.dumps({"wall_s": 40.0}))
    est = runner.announce(cfg, full, mine, mine[1:], str(tmp_path))
    line = capsys.readouterr().err.strip()
    assert est.seconds == 40.0
    assert line == ("sweep: 2 runs of the grid's 4 (mqar), 1 to run, 1 finished already; "
                    "about 40 s (the mean of 1 finished runs here, 40 s each)")


def test_the_full_grid_is_counted_and_its_estimate_grows_with_steps():
    cfg = load_compare_config("compare_mqar", "")
    full = grid.expand_grid(cfg)
    assert len(full) == len(cfg["settings"]) * len(cfg["mixers"]) * len(cfg["sizes"]) \
        * len(cfg["lrs"]) * len(cfg["seeds"])
    one = [r for r in full if r["name"].startswith("T64_kv4__softmax__d64__")][:1]
    short = estimate.estimate(cfg, full, one, "/nonexistent").seconds
    cfg["overrides"]["train"]["steps"] *= 2
    one = [r for r in grid.expand_grid(cfg) if r["name"] == one[0]["name"]]
    longer = estimate.estimate(cfg, full, one, "/nonexistent").seconds
    startup = estimate.STARTUP_S["cpu"]
    # twice the steps: twice the training time, give or take the evaluations
    assert 1.8 < (longer - startup) / (short - startup) < 2.05
    assert short > 3600  # 4,000 steps of a 64-wide model at vocabulary 8192 on 2 cores


def test_a_long_sweep_asks_first_and_a_no_runs_nothing(tmp_path, monkeypatch, capsys):
    from sweeps import run as run_cli
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    assert run_cli._ask_if_long(estimate.Estimate(10.0, "")) is True and not asked
    assert run_cli._ask_if_long(estimate.Estimate(2 * 3600.0, "")) is False and asked
    cfg = load_compare_config("compare_mqar", "tiny")
    records = runner.sweep(cfg, str(tmp_path), only="softmax", progress=False,
                           confirm=lambda est: False)
    assert records == [] and "sweep: nothing run" in capsys.readouterr().err
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # no run was started


def test_an_unknown_sweep_key_is_one_line():
    r = subprocess.run([sys.executable, "-m", "sweeps.run",
                        "--config=configs/compare_mqar.py:tiny", "--workdir=/nonexistent",
                        "--config.overrides.train.log_every=5"], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: ") and "log_every" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
