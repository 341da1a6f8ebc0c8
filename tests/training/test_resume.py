"""The CLI killed and started again carries on exactly; signals save; errors are one line.

Each test runs train.py in a subprocess on the tiny MQAR config (see conftest.py)."""
import os
import re
import signal
import subprocess
import time

import pytest

from tests.training.conftest import ROOT, cli_args, env, run_cli
from training import checkpoint, metrics


def losses(workdir):
    return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}


def wait_for(predicate, proc, timeout=240):
    t0 = time.time()
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"train.py ended early: {proc.stderr.read()}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.02)


def complete_steps(workdir):
    d = workdir / checkpoint.CHECKPOINT_DIR
    if not d.exists():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


def test_sigkill_then_rerun_gives_bitwise_same_losses(tmp_path):
    over = {"train.steps": 200, "train.checkpoint_every": 20, "train.eval_every": 0}
    ref = run_cli(cli_args(over, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    expected = losses(tmp_path / "ref")
    assert sorted(expected) == list(range(1, 201))

    work = tmp_path / "killed"
    proc = subprocess.Popen(cli_args(over, work), cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(s >= 20 for s in complete_steps(work)), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = complete_steps(work)
    assert saved and max(saved) < 200, "the kill should land mid-run"
    newest = max(saved)
    # A save that was killed half-way leaves orbax's tmp directory: never picked up.
    partial = work / checkpoint.CHECKPOINT_DIR / f"{newest + 20}.orbax-checkpoint-tmp-17960"
    (partial / "params").mkdir(parents=True)
    (partial / "params" / "half_written").write_bytes(b"\0" * 64)

    again = run_cli(cli_args(over, work))
    assert again.returncode == 0, again.stderr
    assert f"resuming from step {newest}" in again.stderr
    got = losses(work)
    assert sorted(got) == list(range(1, 201))  # every step once, none duplicated
    assert got == expected  # bitwise: the same float for every step
    # Step 200 twice: its loss and the final eval.
    assert [e["step"] for e in metrics.read_metrics(work)].count(200) == 2


def test_sigterm_saves_current_step_then_exits(tmp_path):
    over = {"train.steps": 100000, "train.checkpoint_every": 100000}
    proc = subprocess.Popen(cli_args(over, tmp_path), cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(losses(tmp_path)) >= 5, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    m = re.search(r"stopped by SIGTERM at step (\d+); checkpoint saved", err)
    assert m, err
    step = int(m.group(1))
    assert complete_steps(tmp_path) == [step]
    assert max(losses(tmp_path)) == step


def test_cli_data_errors_are_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    for files, expect in [(tmp_path / "missing.txt", "missing.txt does not exist"),
                          (tmp_path / "empty.txt", "empty.txt is empty")]:
        r = run_cli(cli_args({"data.source": "files", "data.tokenizer": "byte",
                              "data.files": str(files)}, tmp_path / "w"))
        assert r.returncode == 1
        assert "error: data:" in r.stderr and expect in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
