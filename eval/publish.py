"""Collect finished comparison sweeps into docs/: one results.json and the plots.

    python -m eval.publish --sweeps=DIR [--docs=docs] [--device_file=DIR/device.txt]

DIR holds one sweep directory per name (what eval/h200_sweeps.sh writes); each has a
results.jsonl, results.md and PNG plots. Writes DOCS/results.json ({"device", "sweeps":
{name: {"records": [...], "tables_md": "..."}}}) and copies every plot to
DOCS/results_<sweep>_<plot>.png, which docs/results.md shows.
"""
from __future__ import annotations

import glob
import json
import os
import shutil


def collect(sweeps_dir: str, docs_dir: str, device_file: str | None = None) -> dict:
    out: dict = {"device": None, "sweeps": {}}
    if device_file and os.path.isfile(device_file):
        with open(device_file) as f:
            out["device"] = f.read().strip()
    os.makedirs(docs_dir, exist_ok=True)
    for sweep in sorted(os.listdir(sweeps_dir)):
        path = os.path.join(sweeps_dir, sweep)
        results = os.path.join(path, "results.jsonl")
        if not os.path.isfile(results):
            continue
        with open(results) as f:
            records = [json.loads(line) for line in f if line.strip()]
        md = ""
        if os.path.isfile(os.path.join(path, "results.md")):
            with open(os.path.join(path, "results.md")) as f:
                md = f.read()
        plots = []
        for png in sorted(glob.glob(os.path.join(path, "*.png"))):
            name = f"results_{sweep}_{os.path.basename(png)}"
            shutil.copyfile(png, os.path.join(docs_dir, name))
            plots.append(name)
        out["sweeps"][sweep] = {"records": records, "tables_md": md, "plots": plots}
    tmp = os.path.join(docs_dir, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, os.path.join(docs_dir, "results.json"))
    return out


def main(argv):
    del argv
    from absl import flags

    f = flags.FLAGS
    out = collect(f.sweeps, f.docs, f.device_file)
    for name, s in out["sweeps"].items():
        print(f"{name}: {len(s['records'])} records, plots {s['plots']}")


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("sweeps", None, "Directory of sweep directories.", required=True)
    flags.DEFINE_string("docs", "docs", "Where results.json and the plots go.")
    flags.DEFINE_string("device_file", None, "A text file describing the machine (optional).")
    app.run(main)
