"""A population cell whose final evaluation was cut: each member's last periodic
evaluation (step, eval_accuracy over the run's 256 held-out examples x kv queries), per
lr, with the mean and 95% t-interval over seeds (eval.intervals).

    PYTHONPATH=$PWD python docs/measurements/session27/member_evals.py CELL_DIR
"""
import collections
import json
import os
import sys

from eval import intervals


def last_eval(path):
    rows = [json.loads(line) for line in open(path)]
    evals = [r for r in rows if "eval_accuracy" in r]
    return (evals[-1]["step"], evals[-1]["eval_accuracy"]) if evals else (None, float("nan"))


def main(cell):
    by_lr = collections.defaultdict(dict)
    for member in sorted(os.listdir(cell)):
        path = os.path.join(cell, member, "metrics.jsonl")
        if os.path.isfile(path):
            lr, seed = member.rsplit("_seed", 1)
            by_lr[float(lr[2:])][int(seed)] = last_eval(path)
    print(f"{cell}: each member's last periodic evaluation")
    print("| lr | seeds (step: accuracy) | mean [95% t] |\n|---|---|---|")
    for lr in sorted(by_lr):
        seeds = by_lr[lr]
        iv = intervals.mean_interval(acc for _, acc in seeds.values())
        text = " / ".join(f"{step}: {acc:.4f}" for step, acc in (seeds[s] for s in sorted(seeds)))
        print(f"| {lr:.3g} | {text} | {iv.mean:.4f} [{iv.lo:.4f}, {iv.hi:.4f}] |")


if __name__ == "__main__":
    main(sys.argv[1])
