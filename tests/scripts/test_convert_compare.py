"""scripts/convert_compare's token budget: a conversion and its from-scratch run get at
most token_fraction of the tokens the teacher had seen at the converted checkpoint (the
same batch, so steps), split between the two stages; a failed run does not stop the
comparison."""
import json
import pathlib
import subprocess
import sys

import pytest

from scripts.convert_compare import stage_steps


@pytest.mark.parametrize("teacher_step", [250, 1250, 1500, 1750, 4999])
@pytest.mark.parametrize("fraction, share", [(0.1, 0.5), (0.1, 0.8), (0.05, 0.5)])
def test_the_budget_never_exceeds_the_fraction(teacher_step, fraction, share):
    first, second = stage_steps(teacher_step, fraction, share)
    assert first >= 1 and second >= 1
    assert first + second <= teacher_step * fraction < first + second + 1
    assert abs(first - share * (first + second)) <= 0.5


def test_nanogpt_teachers_best_step():
    # tiny-Shakespeare's char teacher is best near step 1,500 (docs/results.md section 5)
    assert stage_steps(1500, 0.1, 0.5) == (75, 75)


def test_too_few_steps_to_split_is_refused():
    with pytest.raises(SystemExit):
        stage_steps(10, 0.1, 0.5)


def test_table_interval_is_the_t_interval_at_any_count():
    # six values: mean 1.25, sample sd sqrt(0.035) = 0.187083; t(0.975, 5) = 2.570582
    # (any t-table), so the half-width is 2.570582 * 0.187083 / sqrt(6) = 0.196339
    from scripts.convert_compare import _interval
    assert _interval([1.0, 1.1, 1.2, 1.3, 1.4, 1.5]) == "1.2500 +- 0.1963"
    assert _interval([1.4697]) == "1.4697"  # one value: no interval


def finished_run(workdir: str) -> int:
    """What a fake subprocess leaves of a finished from-scratch run: its final eval."""
    pathlib.Path(workdir).mkdir(parents=True)
    (pathlib.Path(workdir) / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "eval_loss": 1.5}) + "\n")
    return 0


def run_scratch_comparison(monkeypatch, out, fake_call):
    """convert_compare.main's from-scratch part, seeds 0-1 x (based, gated_deltanet),
    each run by fake_call(cmd, cwd, stdout, stderr) -> exit status; its SystemExit."""
    from scripts import convert_compare
    monkeypatch.setattr(subprocess, "call", fake_call)
    monkeypatch.setattr(sys, "argv", [
        "convert_compare.py", f"--out={out}", "--data=unused.txt", "--seeds=0,1",
        "--mixers=based,gated_deltanet", "--parts=scratch", "--stage1_steps=1",
        "--stage2_steps=1"])
    with pytest.raises(SystemExit) as exit_info:
        convert_compare.main()
    return exit_info


def test_a_failed_run_is_recorded_and_the_comparison_goes_on(tmp_path, monkeypatch, capsys):
    """One mixer's runs fail: the other mixer's runs of every seed still run and are
    recorded, the failures are recorded as such (no eval loss), the failed run's own log
    lines reach stderr, and the exit status says how many failed."""
    log_lines = {"based": "Traceback ...\nAttributeError: 'Based' object has no attribute"}

    def fake_call(cmd, cwd, stdout, stderr):
        workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
        mixer = next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.model.mixer="))
        stdout.write(f"earlier output of {mixer}\n")
        if mixer in log_lines:
            stdout.write(log_lines[mixer] + "\n")
            return 1
        return finished_run(workdir)

    exit_info = run_scratch_comparison(monkeypatch, tmp_path, fake_call)
    assert "2 run(s) failed" in str(exit_info.value)
    rows = json.loads((tmp_path / "results.json").read_text())
    done = [(r["seed"], r["mixer"]) for r in rows if "eval_loss" in r]
    failed = [(r["seed"], r["mixer"]) for r in rows if "failed" in r]
    assert done == [(0, "gated_deltanet"), (1, "gated_deltanet")]
    assert failed == [(0, "based"), (1, "based")]
    err = capsys.readouterr().err
    assert "AttributeError: 'Based' object has no attribute" in err
    assert "earlier output of gated_deltanet" not in err  # only the failed run's lines


@pytest.mark.parametrize("cut_rc", [0, 143])
def test_a_stop_records_the_run_that_finished_and_starts_no_other(tmp_path, monkeypatch,
                                                                   capsys, cut_rc):
    """SIGTERM arrives while the second run is going (a job's time limit; the signal
    reaches that run's process group too): the comparison waits for it and records it
    where it finished anyway (rc 0), records no failure where the signal cut it (rc 143,
    a training run's exit after saving a checkpoint: it resumes), starts no further run,
    exits 128 + 15 and leaves its handlers as they were."""
    import os
    import signal

    started = []

    def fake_call(cmd, cwd, stdout, stderr):
        workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
        started.append(pathlib.Path(workdir).name)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGTERM)   # handled while this run goes on
            if cut_rc:
                return cut_rc
        return finished_run(workdir)

    before = signal.getsignal(signal.SIGTERM)
    exit_info = run_scratch_comparison(monkeypatch, tmp_path, fake_call)
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert started == ["scratch_based_seed0", "scratch_gated_deltanet_seed0"]
    rows = json.loads((tmp_path / "results.json").read_text())
    assert not [r for r in rows if "failed" in r]
    done = [(r["seed"], r["mixer"]) for r in rows if "eval_loss" in r]
    assert done == [(0, "based")] + ([] if cut_rc else [(0, "gated_deltanet")])
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
