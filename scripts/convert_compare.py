"""Issue 19's comparison: softmax teachers, their conversions, and the same mixers from
scratch on the same tokens, over seeds. Prints a table and writes OUT/results.json.

    python scripts/convert_compare.py --out=runs/convert_compare \\
        --data=/path/to/tinyshakespeare/input.txt --seeds=0,1,2 \\
        --mixers=hedgehog,based,gated_deltanet

For each seed: (1) train.py trains the teacher with --teacher_config
(configs/shakespeare_char_gpu.py, nanoGPT's shakespeare_char recipe: a 5,000-step
schedule, evaluated every 250 steps). The teacher is its checkpoint of lowest validation
loss (--teacher_step=best), as nanoGPT keeps it (always_save_checkpoint=False there);
so the run checkpoints at every evaluation and stops after TEACHER_PATIENCE evaluations
without a new best (the same checkpoint, for less time than the whole schedule).
(2) For each mixer `python -m training.convert --config=configs/convert_<mixer>.py`
converts it, with --token_fraction (10%) of the tokens the teacher had seen at that
checkpoint, split between the stages by --stage1_share (or --stage1_steps /
--stage2_steps as given). (3) train.py trains that mixer from scratch for the same number
of steps of the same batch (its schedule over those steps).

Every run is a subprocess with its own workdir under OUT, so a killed comparison started
again skips what finished and resumes what did not. SIGTERM or SIGINT (a job's time
limit, Ctrl-C) reaches the running subprocess too, which stops by itself (a training run
saves a checkpoint); the comparison waits for it, records it if it had finished, starts
nothing more and exits 128 + the signal's number. A run that fails is recorded as
failed (its log's last lines on stderr) and the comparison goes on with the next run;
the exit status is non-zero when any failed. --parts=scratch runs (3) alone and
--parts=convert (1) and (2); with --teacher_dir (finished teachers) each part can run in
a process of its own. Validation losses are each run's final eval (the same held-out
tail, --eval_batches batches); the teacher's is its eval at the chosen step. `--extra`
passes overrides to the teacher's train.py run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import signal
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from eval import intervals  # noqa: E402  (the repository's modules, run as a script)


class RunFailed(Exception):
    """One run (teacher, conversion or from-scratch) exited non-zero."""


class StopRequest:
    """The signal (SIGTERM / SIGINT) that asked the comparison to stop, or None. Its
    handler only notes it: the wait for the running subprocess goes on (the signal
    reached that process's group too), so a run finishing in the meantime is recorded."""

    def __init__(self):
        self.signum = None

    def handle(self, signum, frame):
        self.signum = signum

    def exit_if_asked(self):
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            print(f"stopped by {name}: finished runs are recorded; run the same command "
                  f"to resume", file=sys.stderr, flush=True)
            sys.exit(128 + self.signum)


# Lines of a failed run's log printed with its failure, so the error reaches a job's own
# output (a GPU call returns that, not the run directories).
FAILED_LOG_LINES = 20


def _run(cmd: list[str], log: pathlib.Path) -> None:
    print("$ " + " ".join(cmd), flush=True)
    start = log.stat().st_size if log.exists() else 0
    with open(log, "a") as f:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if rc:
        with open(log, "rb") as f:  # this run's output only: the log is shared
            f.seek(start)
            tail = f.read().decode(errors="replace").splitlines()[-FAILED_LOG_LINES:]
        print("\n".join(tail), file=sys.stderr, flush=True)
        raise RunFailed(f"failed ({rc}); see {log}")


def _final_eval(workdir: pathlib.Path) -> float:
    text = (workdir / "metrics.jsonl").read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [e["eval_loss"] for e in entries if "eval_loss" in e][-1]


# Evaluations without a new best after which the teacher's run stops (its schedule is
# nanoGPT's 5,000 steps; the validation loss of tiny-Shakespeare's char model is lowest
# near step 1,500 and rises after it: docs/results.md section 5).
TEACHER_PATIENCE = 3


def _teacher_step(workdir: pathlib.Path, which: str) -> int:
    """The step of the teacher checkpoint a conversion loads: the kept best or newest."""
    from training import checkpoint
    ckpt = checkpoint.Checkpointer(workdir, async_save=False, read_only=True)
    step = ckpt.best_step() if which == checkpoint.BEST else max(ckpt.all_steps())
    if step is None:
        sys.exit(f"{workdir}: no checkpoint was saved with an eval loss, so none is the "
                 f"best (the teacher needs checkpoint_every = eval_every)")
    return step


def _eval_at(workdir: pathlib.Path, step: int) -> float:
    text = (workdir / "metrics.jsonl").read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [e["eval_loss"] for e in entries if "eval_loss" in e and e["step"] == step][-1]


def stage_steps(teacher_step: int, fraction: float, stage1_share: float) -> tuple[int, int]:
    """(stage 1, stage 2) steps: `fraction` of the teacher's steps up to its checkpoint
    (rounded down, so the conversion never sees more), stage 1 taking stage1_share."""
    total = int(teacher_step * fraction)
    first = int(round(total * stage1_share))
    if first < 1 or total - first < 1 and stage1_share < 1:
        sys.exit(f"{fraction} of the teacher's {teacher_step} steps is too few to split")
    return first, total - first


def _interval(xs: list[float]) -> str:
    """mean +- the 95% t half-width (eval.intervals), or the one value."""
    iv = intervals.mean_interval(xs)
    return f"{iv.mean:.4f} +- {iv.half:.4f}" if iv.decided else f"{iv.mean:.4f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--data", required=True, help="the text file (tiny-Shakespeare)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--mixers", default="hedgehog,based,gated_deltanet")
    p.add_argument("--teacher_config", default="configs/shakespeare_char_gpu.py")
    p.add_argument("--teacher_dir", help="use finished teacher runs instead of training "
                   "them: a workdir path with {seed} in it (e.g. runs/t/teacher_seed{seed})")
    p.add_argument("--teacher_step", default="best", choices=["best", "latest"],
                   help="the teacher checkpoint converted (best: lowest validation loss)")
    p.add_argument("--token_fraction", type=float, default=0.1,
                   help="the conversion's (and scratch run's) tokens as a fraction of "
                   "the teacher's up to its checkpoint")
    p.add_argument("--stage1_share", type=float, default=0.5)
    p.add_argument("--stage1_steps", type=int, help="fixed steps instead of the fraction")
    p.add_argument("--stage2_steps", type=int, help="fixed steps instead of the fraction")
    p.add_argument("--eval_batches", type=int, default=200)
    p.add_argument("--extra", action="append", default=[],
                   help="an override for the teacher's train.py run")
    p.add_argument("--convert_extra", action="append", default=[],
                   help="an override for every conversion")
    p.add_argument("--scratch_warmup", type=int, default=20,
                   help="the from-scratch runs' warmup steps (the conversion stages' "
                   "warmup; the teacher recipe's 100 would be most of a short run)")
    p.add_argument("--scratch_extra", action="append", default=[],
                   help="an override for every from-scratch run")
    p.add_argument("--results", help="results.json's path (default OUT/results.json), "
                   "rewritten after every run")
    p.add_argument("--parts", default="convert,scratch",
                   help="what to run for each (seed, mixer): convert (needs the teacher) "
                   "and/or scratch (does not, so it can run beside the teachers' training)")
    args = p.parse_args()
    with _signals_noted() as stop:
        _compare(args, stop)


@contextlib.contextmanager
def _signals_noted():
    """A StopRequest noting SIGTERM / SIGINT while inside; the old handlers come back."""
    stop = StopRequest()
    previous = {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGTERM,
                                                               signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _compare(args, stop: StopRequest):
    """The comparison main() parsed the arguments of (module docstring)."""
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    common = [f"--config.data.files={args.data}",
              f"--config.train.eval_batches={args.eval_batches}",
              "--config.logging.progress=False", "--config.logging.wandb=disabled"]
    rows = []
    log = out / "log.txt"
    results = pathlib.Path(args.results) if args.results else out / "results.json"

    def record(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        results.write_text(json.dumps(rows, indent=2) + "\n")

    failures = []

    def ran(cmd: list[str], **row) -> bool:
        """Runs cmd; if it fails, records row as failed and returns False, so the
        comparison goes on with the next run (a seed whose teacher failed skips its
        conversions); the exit status reports it. Once a stop is asked for, starts
        nothing, and a run the signal cut is not a failure (it resumes)."""
        stop.exit_if_asked()
        try:
            _run(cmd, log)
        except RunFailed as e:
            stop.exit_if_asked()
            failures.append(e)
            record(**row, failed=str(e))
            return False
        return True

    parts = set(args.parts.split(","))
    if not parts or parts - {"convert", "scratch"}:
        sys.exit(f"--parts={args.parts!r}: name convert and/or scratch")
    fixed = args.stage1_steps is not None and args.stage2_steps is not None
    if (args.stage1_steps is None) != (args.stage2_steps is None):
        sys.exit("--stage1_steps and --stage2_steps go together")
    if "scratch" in parts and not fixed and "convert" not in parts and not args.teacher_dir:
        sys.exit("--parts=scratch takes its steps from the teacher: give --teacher_dir "
                 "or --stage1_steps and --stage2_steps")
    for seed in [int(s) for s in args.seeds.split(",")]:
        teacher = None
        if "convert" in parts or not fixed:
            if args.teacher_dir:
                teacher = pathlib.Path(args.teacher_dir.format(seed=seed))
            else:
                teacher = out / f"teacher_seed{seed}"
                evals = ["--config.train.checkpoint_every=250", "--config.train.eval_every=250",
                         f"--config.train.early_stop_patience={TEACHER_PATIENCE}"]
                if not ran([py, "train.py", f"--config={args.teacher_config}",
                            f"--workdir={teacher}", f"--config.train.seed={seed}", *common,
                            *evals, *args.extra], seed=seed, run="softmax teacher",
                           mixer="softmax"):
                    continue
            at = _teacher_step(teacher, args.teacher_step)
        if fixed:
            stage1, stage2 = args.stage1_steps, args.stage2_steps
        else:
            stage1, stage2 = stage_steps(at, args.token_fraction, args.stage1_share)
        steps = stage1 + stage2
        if "convert" in parts:
            record(seed=seed, run="softmax teacher", mixer="softmax", step=at,
                   eval_loss=_eval_at(teacher, at))
        for mixer in args.mixers.split(","):
            if "convert" in parts:
                conv = out / f"convert_{mixer}_seed{seed}"
                if ran([py, "-m", "training.convert", f"--config=configs/convert_{mixer}.py",
                        f"--workdir={conv}", f"--config.convert.teacher={teacher}",
                        f"--config.train.seed={seed}",
                        f"--config.convert.teacher_step={args.teacher_step}",
                        f"--config.convert.stage1_steps={stage1}",
                        f"--config.convert.stage2_steps={stage2}",
                        f"--config.train.eval_batches={args.eval_batches}",
                        "--config.logging.progress=False", "--config.logging.wandb=disabled",
                        *args.convert_extra], seed=seed, run="converted", steps=steps,
                       mixer=mixer):
                    report = json.loads((conv / "report.json").read_text())
                    for stage in ("stage1_eval", "stage2_eval"):
                        if stage in report:
                            record(seed=seed, run=f"converted (after {stage[:6]})",
                                   steps=steps, mixer=mixer,
                                   eval_loss=report[stage]["eval_loss"],
                                   agreement=report.get("agreement_" + stage[:6]))
            if "scratch" in parts:
                scratch = out / f"scratch_{mixer}_seed{seed}"
                if ran([py, "train.py", f"--config={args.teacher_config}",
                        f"--workdir={scratch}", f"--config.train.seed={seed}",
                        f"--config.model.mixer={mixer}", f"--config.train.steps={steps}",
                        f"--config.train.warmup_steps={args.scratch_warmup}",
                        *common, *args.scratch_extra], seed=seed, run="scratch (same tokens)",
                       steps=steps, mixer=mixer):
                    record(seed=seed, run="scratch (same tokens)", steps=steps, mixer=mixer,
                           eval_loss=_final_eval(scratch))
    stop.exit_if_asked()
    groups: dict = {}
    for r in rows:
        if "eval_loss" in r:
            groups.setdefault((r["mixer"], r["run"]), []).append(r["eval_loss"])
    _print_table(groups)
    if failures:
        sys.exit(f"{len(failures)} run(s) failed: " + "; ".join(map(str, failures)))


def _print_table(groups: dict) -> None:
    if ("softmax", "softmax teacher") not in groups:
        return
    teacher = statistics.mean(groups[("softmax", "softmax teacher")])
    print("\n| mixer | run | val loss (mean +- 95% t-interval) | vs teacher |\n"
          "|---|---|---|---|")
    for (mixer, run), xs in groups.items():
        print(f"| {mixer} | {run} | {_interval(xs)} | "
              f"{100 * (statistics.mean(xs) / teacher - 1):+.1f}% |")


if __name__ == "__main__":
    main()
