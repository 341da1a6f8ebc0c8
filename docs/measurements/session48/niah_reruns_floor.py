"""Session 48: session 47's re-run check (docs/measurements/session47/niah_reruns.py)
with the prediction interval's binomial floor (eval.intervals.prediction_interval's
trials: the examples each seed was scored on at the training length). Post hoc: the
floor was added after these re-runs were seen, so this says how the published intervals
would have fared, not a fresh test of the new ones. Run in the folder of session 47's
combined report (docs/measurements/session47/niah_combined)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from eval import intervals, report  # noqa: E402

records = [json.loads(line) for line in open("results.jsonl")]
TASKS = ["passkey", "multikey", "passkey7", "mk2", "mk3", "mv"]


def at_train(metrics, task):
    """(exact match, examples) at the training length, as the report's tables read it."""
    grid = report.niah_task_grids(metrics)[task] if task else metrics["grid"]
    length = grid["train_length"]
    return (report._at_length_of(grid, length, "exact"),
            report._examples_at_length_of(grid, length))


counts = {"without": 0, "with": 0}
total = 0
for mixer in ["softmax", "hybrid"]:
    runs = sorted((r for r in records if r["mixer"] == mixer and abs(r["lr"] - 3e-4) < 1e-9),
                  key=lambda r: r["seed"])
    for task in TASKS:
        pairs = [at_train(r["metrics"], task) for r in runs]
        old, new = [v for v, _ in pairs[:3]], [v for v, _ in pairs[3:]]
        fewest = min(n for _, n in pairs[:3])
        plain = intervals.prediction_interval(old)
        floored = intervals.prediction_interval(old, trials=fewest)
        inside = [sum(iv.lo <= y <= iv.hi for y in new) for iv in (plain, floored)]
        counts["without"] += inside[0]
        counts["with"] += inside[1]
        total += len(new)
        print(f"{mixer:8s} {task:9s} {fewest:5d} examples, seeds 0-2 {plain.mean:.3f}: new seed "
              f"[{plain.lo:.3f}, {plain.hi:.3f}], with the floor [{floored.lo:.3f}, "
              f"{floored.hi:.3f}]; seeds 3-5 {' '.join(f'{y:.3f}' for y in new)}: inside "
              f"{inside[0]}/3, {inside[1]}/3")
print(f"inside the new-seed interval {counts['without']} of {total}; with the binomial "
      f"floor {counts['with']} of {total} (the passkey-grid column of session 47's check, "
      "a mean over lengths, has no floor and is left out)")
