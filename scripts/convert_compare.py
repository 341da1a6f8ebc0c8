"""Issue 19's comparison: softmax teachers, their conversions, and the same mixers from
scratch on the same tokens, over seeds. Prints a table and writes OUT/results.json.

    python scripts/convert_compare.py --out=runs/convert_compare \\
        --data=/path/to/tinyshakespeare/input.txt --seeds=0,1,2 \\
        --mixers=hedgehog,based,gated_deltanet

For each seed: (1) train.py trains the teacher with --teacher_config
(configs/shakespeare_char_gpu.py: 5,000 steps of 64 x 256 tokens); (2) for each mixer
`python -m training.convert --config=configs/convert_<mixer>.py` converts it (stage 1 +
stage 2 steps of the same batch, 250 + 250 by default: 10% of the teacher's tokens);
(3) train.py trains that mixer from scratch for the conversion's total steps. Every run
is a subprocess with its own workdir under OUT, so a killed comparison started again
skips what finished and resumes what did not. --parts=scratch runs (3) alone (it needs
no teacher, so a job can run it beside the teachers' training), --parts=convert (1) and
(2). Validation losses are each run's final eval (the same held-out tail, --eval_batches
batches). `--extra` passes overrides to
every run (e.g. --extra=--config.train.steps=2000 for a shorter teacher).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(cmd: list[str], log: pathlib.Path) -> None:
    print("$ " + " ".join(cmd), flush=True)
    with open(log, "a") as f:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if rc:
        sys.exit(f"failed ({rc}); see {log}")


def _final_eval(workdir: pathlib.Path) -> float:
    text = (workdir / "metrics.jsonl").read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [e["eval_loss"] for e in entries if "eval_loss" in e][-1]


def _interval(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.4f}"
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}.get(len(xs), 2.0)
    half = t * statistics.stdev(xs) / math.sqrt(len(xs))
    return f"{statistics.mean(xs):.4f} +- {half:.4f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--data", required=True, help="the text file (tiny-Shakespeare)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--mixers", default="hedgehog,based,gated_deltanet")
    p.add_argument("--teacher_config", default="configs/shakespeare_char_gpu.py")
    p.add_argument("--teacher_dir", help="use finished teacher runs instead of training "
                   "them: a workdir path with {seed} in it (e.g. runs/t/teacher_seed{seed})")
    p.add_argument("--stage1_steps", type=int, default=250)
    p.add_argument("--stage2_steps", type=int, default=250)
    p.add_argument("--eval_batches", type=int, default=200)
    p.add_argument("--extra", action="append", default=[],
                   help="an override for the teacher's train.py run")
    p.add_argument("--convert_extra", action="append", default=[],
                   help="an override for every conversion")
    p.add_argument("--scratch_extra", action="append", default=[],
                   help="an override for every from-scratch run")
    p.add_argument("--results", help="results.json's path (default OUT/results.json), "
                   "rewritten after every run")
    p.add_argument("--parts", default="convert,scratch",
                   help="what to run for each (seed, mixer): convert (needs the teacher) "
                   "and/or scratch (does not, so it can run beside the teachers' training)")
    args = p.parse_args()
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

    parts = set(args.parts.split(","))
    if not parts or parts - {"convert", "scratch"}:
        sys.exit(f"--parts={args.parts!r}: name convert and/or scratch")
    steps = args.stage1_steps + args.stage2_steps
    for seed in [int(s) for s in args.seeds.split(",")]:
        if "convert" in parts:
            if args.teacher_dir:
                teacher = pathlib.Path(args.teacher_dir.format(seed=seed))
            else:
                teacher = out / f"teacher_seed{seed}"
                _run([py, "train.py", f"--config={args.teacher_config}",
                      f"--workdir={teacher}", f"--config.train.seed={seed}", *common,
                      *args.extra], log)
            record(seed=seed, run="softmax teacher", mixer="softmax",
                   eval_loss=_final_eval(teacher))
        for mixer in args.mixers.split(","):
            if "convert" in parts:
                conv = out / f"convert_{mixer}_seed{seed}"
                _run([py, "-m", "training.convert", f"--config=configs/convert_{mixer}.py",
                      f"--workdir={conv}", f"--config.convert.teacher={teacher}",
                      f"--config.train.seed={seed}",
                      f"--config.convert.stage1_steps={args.stage1_steps}",
                      f"--config.convert.stage2_steps={args.stage2_steps}",
                      f"--config.train.eval_batches={args.eval_batches}",
                      "--config.logging.progress=False", "--config.logging.wandb=disabled",
                      *args.convert_extra], log)
                report = json.loads((conv / "report.json").read_text())
                for stage in ("stage1_eval", "stage2_eval"):
                    if stage in report:
                        record(seed=seed, run=f"converted (after {stage[:6]})",
                               mixer=mixer, eval_loss=report[stage]["eval_loss"],
                               agreement=report.get("agreement_" + stage[:6]))
            if "scratch" in parts:
                scratch = out / f"scratch_{mixer}_seed{seed}"
                _run([py, "train.py", f"--config={args.teacher_config}",
                      f"--workdir={scratch}", f"--config.train.seed={seed}",
                      f"--config.model.mixer={mixer}", f"--config.train.steps={steps}",
                      *common, *args.scratch_extra], log)
                record(seed=seed, run=f"scratch ({steps} steps)", mixer=mixer,
                       eval_loss=_final_eval(scratch))
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["mixer"], r["run"]), []).append(r["eval_loss"])
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
