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

from eval import intervals


def main(path):
    cells = collections.defaultdict(lambda: collections.defaultdict(dict))
    walls = collections.defaultdict(set)
    state = {}
    for line in open(path):
        r = json.loads(line)
        key = (r["mixer"], r["size"])
        cells[key][r["lr"]][r["seed"]] = r["metrics"]["accuracy"]
        walls[key].add((round(r["train_wall_s"]), r["population"]["members"]))
        state[key] = r["state_size"]
    lrs = sorted({lr for c in cells.values() for lr in c})
    print("| mixer | size | state | " + " | ".join(f"lr {lr:.3g}" for lr in lrs)
          + " | best lr: seeds | a new seed, 95% | training s (members) |")
    print("|---|---|---|" + "---|" * len(lrs) + "---|---|---|")
    for key in sorted(cells, key=lambda k: (k[0], int(k[1][1:].split("_")[0]), k[1])):
        by_lr = cells[key]
        ivs = {lr: intervals.mean_interval(by_lr[lr].values()) for lr in by_lr}
        best = max(ivs, key=lambda lr: ivs[lr].mean)
        row = []
        for lr in lrs:
            iv = ivs.get(lr)
            if iv is None:
                text = "-"
            elif iv.decided:
                text = f"{iv.mean:.4f} [{iv.lo:.4f}, {iv.hi:.4f}]"
            else:
                text = f"{iv.mean:.4f}"
            row.append(f"**{text}**" if lr == best else text)
        seeds = " / ".join(f"{by_lr[best][s]:.4f}" for s in sorted(by_lr[best]))
        new = intervals.prediction_interval(by_lr[best].values())
        new_seed = f"[{new.lo:.4f}, {new.hi:.4f}]" if new.decided else "-"
        wall = ", ".join(f"{w} ({m})" for w, m in sorted(walls[key], key=lambda x: -x[1]))
        print(f"| {key[0]} | {key[1]} | {state[key]:,} | " + " | ".join(row)
              + f" | {seeds} | {new_seed} | {wall} |")


if __name__ == "__main__":
    main(sys.argv[1])
