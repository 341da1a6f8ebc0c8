"""Collect finished comparison sweeps into docs/: one results.json and the plots.

    python -m sweeps.publish --sweeps=DIR [--docs=docs] [--device_file=DIR/device.txt]

DIR holds one sweep directory per name (what sweeps/h200_sweeps.sh writes); each has a
results.jsonl, results.md and PNG plots. Writes DOCS/results.json ({"device", "sweeps":
{name: {"records": [...], "tables_md": "..."}}}) and copies every plot to
DOCS/results_<sweep>_<plot>.png, which docs/results.md shows.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil

from sweeps import outputs


def incomplete_runs(sweep_dir: str) -> list[dict]:
    """Runs that were stopped before their done.json: what their training log says
    (loss curve, best validation loss so far, last step, training tokens/s)."""
    from sweeps.tasks import read_train_log

    out = []
    for run, d in _run_dirs(sweep_dir):
        logged = read_train_log(d)
        if not logged:
            continue
        steps = []
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                try:
                    steps.append(int(json.loads(line).get("step", 0)))
                except (json.JSONDecodeError, TypeError, ValueError):
                    pass
        out.append({"run": run, "last_step": max(steps) if steps else None, **logged})
    return out


def _run_dirs(sweep_dir: str) -> list[tuple[str, str]]:
    """(name, directory) of every run that trained in the sweep and has no done.json: a
    run's own directory, or a population member's (CELL/lr.._seed.., sweeps.populations),
    whose record is done when some run's done.json names it as its member_dir."""
    names = sorted(n for n in os.listdir(sweep_dir)
                   if os.path.isdir(os.path.join(sweep_dir, n)))
    recorded = set()
    for n in names:
        done = os.path.join(sweep_dir, n, "done.json")
        if os.path.isfile(done):
            with open(done) as f:
                recorded.add(json.load(f).get("member_dir"))
    out = []
    for n in names:
        d = os.path.join(sweep_dir, n)
        if os.path.isfile(os.path.join(d, "done.json")):
            continue
        members = [m for m in sorted(os.listdir(d)) if re.fullmatch(r"lr.+_seed-?\d+", m)
                   and os.path.isfile(os.path.join(d, m, "metrics.jsonl"))]
        if members:  # a population's cell
            out += [(f"{n}/{m}", os.path.join(d, m)) for m in members
                    if f"{n}/{m}" not in recorded]
        else:
            out.append((n, d))
    return out


def collect(sweeps_dir: str, docs_dir: str, device_file: str | None = None) -> dict:
    out: dict = {"device": None, "sweeps": {}}
    if device_file and os.path.isfile(device_file):
        with open(device_file) as f:
            out["device"] = f.read().strip()
    os.makedirs(docs_dir, exist_ok=True)
    for sweep in sorted(os.listdir(sweeps_dir)):
        path = os.path.join(sweeps_dir, sweep)
        if not os.path.isdir(path):
            continue
        # A line that does not parse (a copy cut mid-write) is named and left out.
        records = list(outputs.records_file(os.path.join(path, "results.jsonl")).values())
        md = ""
        if os.path.isfile(os.path.join(path, "results.md")):
            with open(os.path.join(path, "results.md")) as f:
                md = f.read()
        plots = []
        for png in sorted(glob.glob(os.path.join(path, "*.png"))):
            if os.path.basename(png) == "speed.png":
                continue  # replaced by the combined results_speed.png below
            name = f"results_{sweep}_{os.path.basename(png)}"
            shutil.copyfile(png, os.path.join(docs_dir, name))
            plots.append(name)
        incomplete = incomplete_runs(path)
        curves = {f"{r['run']} (stopped at step {r['last_step']})": [r["curve"]]
                  for r in incomplete if r.get("curve")}
        if curves:  # stopped runs still have their validation curves
            from eval import plots as plotting

            name = f"results_{sweep}_incomplete_loss_curves.png"
            plotting.loss_curves(curves, os.path.join(docs_dir, name))
            plots.append(name)
        out["sweeps"][sweep] = {"records": records, "tables_md": md, "plots": plots,
                                "incomplete": incomplete}
    speed = [r for s in out["sweeps"].values() for r in s["records"]
             if r.get("task") == "speed"]
    if speed:  # the decode and train halves in one figure
        from eval import plots as plotting
        from sweeps.outputs import speed_series

        plotting.speed_plot(speed_series(speed),
                            os.path.join(docs_dir, "results_speed.png"))
        out["speed_plot"] = "results_speed.png"
    tmp = os.path.join(docs_dir, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, os.path.join(docs_dir, "results.json"))
    return out


def main(argv):
    del argv
    from absl import flags

    f = flags.FLAGS
    if not os.path.isdir(f.sweeps):
        raise SystemExit(f"error: --sweeps={f.sweeps} is not a directory: give the folder "
                         "holding the sweeps (each a python -m sweeps.run --workdir), e.g. "
                         "runs/sweeps")
    out = collect(f.sweeps, f.docs, f.device_file)
    for name, s in out["sweeps"].items():
        print(f"{name}: {len(s['records'])} records, plots {s['plots']}")


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("sweeps", None, "Directory of sweep directories.", required=True)
    flags.DEFINE_string("docs", "docs", "Where results.json and the plots go.")
    flags.DEFINE_string("device_file", None,
                        "A text file describing the machine (optional).")
    app.run(main)
