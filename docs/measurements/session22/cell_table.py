"""Issue 18's sweep as one markdown table: per cell (mixer, size: a width, or a width
and a window as d128_w16) every lr's seeds and mean [95% t], the best lr's in bold, where
one more seed of the best lr should land (eval.intervals.prediction_interval), and the
cell's training wall time.

    PYTHONPATH=$PWD python docs/measurements/session22/cell_table.py \\
        runs/h200/zoology_paper/results.jsonl
"""
import collections
import json
import sys

from configs import mqar_zoology_paper
from eval import intervals

LRS = (1e-4, 4.64e-4, 2.15e-3, 1e-2)  # the paper recipe's logspace(-4, -2, 4), rounded
# Zoology's early stop, as the recipe sets it: a member whose accuracy stays below it ran
# the whole budget, still learning (where MQAR's sudden rise times differ most between
# seeds) or at a plateau the mixer cannot pass.
STOP = mqar_zoology_paper.get_config().train.early_stop_accuracy
BELOW_STOP_MARK = " (below stop)"
BELOW_STOP_NOTE = (f"(below stop): a seed of the best lr ended below Zoology's {STOP} stop "
                   "after the whole budget, still learning or at a plateau (the sliding "
                   "window's 0.597). Where still learning, 3 seeds under-state the spread: "
                   "new seeds have landed outside such intervals (session 27: 2 of 3 for "
                   "hedgehog_distill on the CPU recipe).")
HEADER = ("| mixer | size | state | " + " | ".join(f"lr {lr:.3g}" for lr in LRS)
          + " | best lr: seeds | a new seed, 95% | training s (members) |\n"
          + "|---|---|---|" + "---|" * len(LRS) + "---|---|---|")


def cell_order(key):
    """(mixer, size) in the table's order: by mixer, then width, then window."""
    return key[0], int(key[1][1:].split("_")[0]), key[1]


def below_stop(best_seeds) -> bool:
    """Whether any seed of a cell's best lr ended below the stop (BELOW_STOP_NOTE)."""
    return min(best_seeds) < STOP


def cell_rows(path):
    """{(mixer, size): (markdown row, best lr's mean, its 95% half-width, state)} of a
    sweep's results.jsonl."""
    with open(path) as f:
        return cell_rows_of([json.loads(line) for line in f if line.strip()])


def cell_rows_of(records):
    """cell_rows of records (results.jsonl's lines, parsed)."""
    cells = collections.defaultdict(lambda: collections.defaultdict(dict))
    walls = collections.defaultdict(set)
    state = {}
    for r in records:
        key = (r["mixer"], r["size"])
        cells[key][r["lr"]][r["seed"]] = r["metrics"]["accuracy"]
        walls[key].add((round(r["train_wall_s"]), r["population"]["members"]))
        state[key] = r["state_size"]
    out = {}
    for key, by_lr in cells.items():
        column = {lr: next((c for c in LRS if abs(lr - c) <= 0.01 * c), None) for lr in by_lr}
        stray = [lr for lr, c in column.items() if c is None]
        if stray:
            raise ValueError(f"{key}: lrs {stray} are not the paper recipe's {LRS}")
        ivs = {lr: intervals.mean_interval(by_lr[lr].values()) for lr in by_lr}
        best = max(ivs, key=lambda lr: ivs[lr].mean)
        by_column = {column[lr]: iv for lr, iv in ivs.items()}
        row = []
        for lr in LRS:
            iv = by_column.get(lr)
            if iv is None:
                text = "-"
            elif iv.decided:
                text = f"{iv.mean:.4f} [{iv.lo:.4f}, {iv.hi:.4f}]"
            else:
                text = f"{iv.mean:.4f}"
            row.append(f"**{text}**" if iv is ivs[best] else text)
        seeds = " / ".join(f"{by_lr[best][s]:.4f}" for s in sorted(by_lr[best]))
        new = intervals.prediction_interval(by_lr[best].values())
        new_seed = f"[{new.lo:.4f}, {new.hi:.4f}]" if new.decided else "-"
        if below_stop(by_lr[best].values()):
            new_seed += BELOW_STOP_MARK
        wall = ", ".join(f"{w} ({m})" for w, m in sorted(walls[key], key=lambda x: -x[1]))
        text = (f"| {key[0]} | {key[1]} | {state[key]:,} | " + " | ".join(row)
                + f" | {seeds} | {new_seed} | {wall} |")
        out[key] = (text, ivs[best].mean, ivs[best].half, state[key])
    return out


def main(path):
    print(HEADER)
    rows = cell_rows(path)
    for key in sorted(rows, key=cell_order):
        print(rows[key][0])
    print("\n" + BELOW_STOP_NOTE)


if __name__ == "__main__":
    main(sys.argv[1])
