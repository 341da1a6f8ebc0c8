"""Tokens/s of train.py itself, side by side, and nanoGPT's train.py on the same text.

    python scripts/train_speed.py --text PATH/input.txt --out DIR \\
        [--rows shake,d1024_T2048,d1024_T8192,losses] [--mixers softmax,gated_deltanet]
        [--nanogpt PATH/nanoGPT]

Each row is one train.py process after the other (nothing else on the device), and its
figure is the median of the rates train.py logs every 10 steps (metrics.jsonl) over the
second half of the steps, so the first step and its compilation are excluded. Rows:
  shake         configs/shakespeare_char_gpu.py, softmax and gated_deltanet, 320 steps
  d1024_T2048   8 layers, d_model 1024, 8 heads, byte-level text packed by paragraph
  d1024_T8192   (so rows carry segment ids), batch 4, softmax and gated_deltanet;
                softmax over the packed rows takes the faster of cuDNN's two forms
  losses        the first 200 losses of gated_deltanet through the Pallas kernels and
                through the chunk form (model.impl=chunk), logged every step
With --nanogpt (a checkout of karpathy/nanoGPT), its own train.py with its shipped
config/train_shakespeare_char.py runs on the same text first (data/shakespeare_char/
prepare.py on a copy of it), and its median per-iteration time over the second half is
reported as tokens/s. Writes DIR/train_speed.json after every row.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# No evaluations or checkpoints inside the timed steps; the final evaluation train.py always
# makes reads one batch (the Shakespeare recipe's 200 would only lengthen each row).
QUIET = ["--config.logging.wandb=disabled", "--config.logging.progress=False",
         "--config.train.eval_every=0", "--config.train.checkpoint_every=0",
         "--config.train.eval_batches=1"]
SHAKESPEARE = "configs/shakespeare_char_gpu.py"


def d1024(seq_len: int) -> list[str]:
    # Softmax layers get the documents the faster way: cuDNN's packed-sequence layout at
    # T >= 8,192 (53 paragraphs a row: attention within them only, 1.95x faster), the
    # mask elsewhere (at T 2,048 the packed layout is the slower; docs/benchmarks.md,
    # session 37), so the linear mixers are compared against softmax at its best.
    packed = 128 if seq_len >= 8192 else 0
    return ["--config.model.d_model=1024", "--config.model.num_layers=8",
            "--config.model.num_heads=8", f"--config.model.max_len={seq_len}",
            f"--config.data.seq_len={seq_len}", "--config.data.sample_by=paragraph",
            f"--config.model.attention_max_segments={packed}",
            "--config.train.batch_size=4"]


def mixer_args(mixer: str) -> list[str]:
    """train.py flags of a row's mixer; "hybrid" is the 1-in-8 hybrid, set as
    configs/hybrid.py sets it."""
    if mixer == "hybrid":
        return ["--config.model.mixer=gated_deltanet", "--config.model.softmax_every=8"]
    return [f"--config.model.mixer={mixer}"]


def run_ours(name, config, text, steps, log_every, extra, workroot) -> dict:
    """One train.py run; its median logged tokens/s over the second half and its losses."""
    workdir = workroot / name
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [sys.executable, str(ROOT / "train.py"), f"--config={ROOT / config}",
           f"--workdir={workdir}", f"--config.data.files={text}",
           f"--config.train.steps={steps}", f"--config.train.log_every={log_every}",
           *QUIET, *extra]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - start
    if proc.returncode:
        return {"failed": proc.stderr[-2000:], "wall_s": wall}
    logged = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    train = [r for r in logged if "tokens_per_s" in r and "loss" in r]
    late = [r for r in train if r["step"] > steps // 2]
    first = next(r for r in train if r["step"] == 1)
    config = json.loads((workdir / "config.json").read_text())
    tokens_per_step = config["train"]["batch_size"] * config["data"]["seq_len"]
    # Step 1's logged rate is timed from before its compilation (training.loop._Speed).
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in late),
            # MFU is logged only where the device's peak is known (not on a CPU)
            "mfu": statistics.median(r["mfu"] for r in late) if "mfu" in late[0] else None,
            "wall_s": wall,
            "first_step_s": tokens_per_step / first["tokens_per_s"],
            "losses": [(r["step"], r["loss"]) for r in train]}


def run_nanogpt(repo: pathlib.Path, text: str, iters: int) -> dict:
    data = repo / "data" / "shakespeare_char"
    shutil.copy(text, data / "input.txt")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True,
                   capture_output=True)
    start = time.time()
    proc = subprocess.run([sys.executable, "train.py", "config/train_shakespeare_char.py",
                           f"--max_iters={iters}", f"--lr_decay_iters={iters}",
                           "--eval_interval=1000000", "--log_interval=10"],
                          cwd=repo, capture_output=True, text=True)
    iterations = [(int(i), float(loss), float(ms)) for i, loss, ms in re.findall(
        r"iter (\d+): loss ([\d.]+), time ([\d.]+)ms", proc.stdout)]
    if proc.returncode or not iterations:
        return {"failed": (proc.stdout + proc.stderr)[-2000:]}
    ms = statistics.median(t for i, _, t in iterations if i > iters // 2)
    # the shipped config's batch 64 x block 256 tokens per iteration
    return {"ms_per_iter": ms, "tokens_per_s": 64 * 256 / (ms / 1e3),
            "wall_s": time.time() - start, "losses": [(i, l) for i, l, _ in iterations]}


def loss_gap(a: dict, b: dict) -> dict:
    """The largest and mean |loss difference| over the steps both runs logged."""
    la, lb = dict(a.get("losses", [])), dict(b.get("losses", []))
    gaps = [abs(la[s] - lb[s]) for s in la if s in lb]
    return {"steps": len(gaps), "max": max(gaps), "mean": statistics.mean(gaps)} if gaps \
        else {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True, help="the training text (tiny-Shakespeare)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="shake,d1024_T2048,d1024_T8192,losses")
    ap.add_argument("--steps", type=int, default=320)
    ap.add_argument("--mixers", default="softmax,gated_deltanet",
                    help="mixer names, or hybrid (7 gated_deltanet layers + 1 softmax)")
    ap.add_argument("--nanogpt", default="", help="a karpathy/nanoGPT checkout")
    ap.add_argument("--workroot", default="/tmp/train_speed")
    ap.add_argument("--extra", default="",
                    help="train.py flags added to every row, space-separated, given as "
                         "--extra='...' (argparse takes a lone '--flag' after --extra for "
                         "an option of its own)")
    ap.add_argument("--tag", default="", help="suffix of the row names")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workroot = pathlib.Path(args.workroot)
    text = str(pathlib.Path(args.text).resolve())
    results: dict = {}
    extra = args.extra.split()

    def record(name, rec):
        results[name] = rec
        (out / "train_speed.json").write_text(json.dumps(results, indent=1))
        brief = {k: (round(v) if k == "tokens_per_s" else v) for k, v in rec.items()
                 if k != "losses"}
        print(f"{name}: {brief}", flush=True)

    if args.nanogpt:
        record("nanogpt", run_nanogpt(pathlib.Path(args.nanogpt), text, args.steps))
    rows = set(filter(None, args.rows.split(",")))
    mixers = args.mixers.split(",")
    if "shake" in rows:
        for mixer in mixers:
            name = f"shake_{mixer}{args.tag}"
            record(name, run_ours(name, SHAKESPEARE, text, args.steps, 10,
                                  mixer_args(mixer) + extra, workroot))
    for seq_len in (2048, 8192):
        if f"d1024_T{seq_len}" in rows:
            for mixer in mixers:
                name = f"d1024_T{seq_len}_{mixer}{args.tag}"
                record(name, run_ours(name, "configs/lm_files.py", text, args.steps, 10,
                                      d1024(seq_len) + mixer_args(mixer) + extra,
                                      workroot))
    if "losses" in rows:
        gdn = ["--config.model.mixer=gated_deltanet"]
        record("losses_pallas", run_ours("losses_pallas", SHAKESPEARE, text, 200, 1, gdn,
                                         workroot))
        record("losses_chunk", run_ours("losses_chunk", SHAKESPEARE, text, 200, 1,
                                        gdn + ["--config.model.impl=chunk"], workroot))
        record("loss_gap", loss_gap(results["losses_pallas"], results["losses_chunk"]))


if __name__ == "__main__":
    main()
