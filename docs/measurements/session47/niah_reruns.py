"""Session 47: do softmax's and the hybrid's new seeds 3-5 at lr 3e-4 land inside what
seeds 0-2 (published in sessions 45-46) gave: the 95% t-interval of the mean, and the 95%
prediction interval of one more seed (eval.intervals.prediction_interval: sqrt(n + 1) =
2x as wide at n 3)? Run in the folder of the combined report's results.jsonl."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from eval import intervals, report  # noqa: E402

records = [json.loads(line) for line in open("results.jsonl")]
TASKS = ["passkey", "multikey", "passkey7", "mk2", "mk3", "mv"]


def at_train(metrics, task):
    """Exact match at the training length, as the report's task tables read it."""
    grid = report.niah_task_grids(metrics)[task]
    return report._at_length_of(grid, grid["train_length"], "exact")


counts = {"mean": 0, "new seed": 0}
total = 0
for mixer in ["softmax", "hybrid"]:
    runs = sorted((r for r in records if r["mixer"] == mixer and abs(r["lr"] - 3e-4) < 1e-9),
                  key=lambda r: r["seed"])
    columns = [(task, lambda m, t=task: at_train(m, t)) for task in TASKS]
    columns.append(("passkey grid", lambda m: m["exact"]))
    for name, value in columns:
        vals = [value(r["metrics"]) for r in runs]
        old, new = vals[:3], vals[3:]
        mean_iv, seed_iv = intervals.mean_interval(old), intervals.prediction_interval(old)
        in_mean = sum(mean_iv.lo <= y <= mean_iv.hi for y in new)
        in_seed = sum(seed_iv.lo <= y <= seed_iv.hi for y in new)
        counts["mean"] += in_mean
        counts["new seed"] += in_seed
        total += len(new)
        print(f"{mixer:8s} {name:13s} seeds 0-2 {mean_iv.mean:.3f}: mean [{mean_iv.lo:.3f}, "
              f"{mean_iv.hi:.3f}], new seed [{seed_iv.lo:.3f}, {seed_iv.hi:.3f}]; seeds 3-5 "
              f"{' '.join(f'{y:.3f}' for y in new)}: inside {in_mean}/3, {in_seed}/3")
print(f"inside the mean's interval {counts['mean']} of {total}; inside the new-seed "
      f"interval {counts['new seed']} of {total}")
