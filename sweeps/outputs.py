"""What a sweep directory shows: results.jsonl, results.md and the plots, rebuilt from
the runs' record files (sweeps.runner) in grid order."""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Mapping


def read_records(runs: list[dict], workdir: str) -> tuple[list[dict], list[str]]:
    """(records of finished and partial runs, one line per failed or partial run)."""
    records, failed = [], []
    for run in runs:
        run_dir = os.path.join(workdir, run["name"])
        done, fail, partial = (os.path.join(run_dir, f)
                               for f in ("done.json", "failed.json", "partial.json"))
        if os.path.isfile(done):
            with open(done) as f:
                records.append(json.load(f))
        elif os.path.isfile(fail):
            with open(fail) as f:
                failed.append(f"{run['name']}: {json.load(f).get('error', '')[:300]}")
        elif os.path.isfile(partial):
            with open(partial) as f:
                rec = json.load(f)
            records.append(rec)  # in the tables, flagged; not `done`
            failed.append(f"{run['name']} (incomplete, its numbers are in the tables): "
                          f"{rec.get('partial')}")
    return records, failed


def write_outputs(cfg: Mapping, runs: list[dict], workdir: str) -> list[dict]:
    """results.jsonl, results.md and plots from every run's record file, in grid order."""
    from eval import report

    records, failed = read_records(runs, workdir)
    write_atomic(os.path.join(workdir, "results.jsonl"),
                 "".join(json.dumps(r) + "\n" for r in records))
    try:
        written = plot(cfg, records, workdir)
    except Exception as e:  # noqa: BLE001 (a plot must never lose the tables)
        print(f"sweep: plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
        written = []
    md = report.markdown(records, title=cfg.get("title", f"Comparison: {cfg['task']}"),
                         settings_order=[s["name"] for s in cfg.get("settings") or []],
                         plots=[os.path.basename(p) for p in written], failed=failed,
                         metric=cfg.get("metric"))
    write_atomic(os.path.join(workdir, "results.md"), md)
    return records


def plot(cfg: Mapping, records: list[dict], workdir: str) -> list[str]:
    """The task's PNGs in `workdir`: loss curves (lm), recall against state size (mqar,
    niah) and heatmaps (niah), throughput by length (speed); returns their paths."""
    from eval import plots, report

    written = []
    task = cfg["task"]
    best = report.best_lr(records, cfg.get("metric"))
    if task == "lm":
        # each mixer at its best lr: the mean curve over seeds, their spread as a band
        curves = {f"{k[2]} {k[3]} lr={b['lr']:g}":
                  [r["metrics"].get("curve", []) for r in b["records"]]
                  for k, b in best.items()}
        if any(any(c) for c in curves.values()):
            written.append(plots.loss_curves(curves,
                                             os.path.join(workdir, "loss_curves.png")))
    elif task in ("mqar", "niah"):
        metric, _ = report.primary(task, cfg.get("metric"))
        # each point: the best lr's mean over seeds, its 95% interval as the error bar
        pts = [{"setting": k[1], "mixer": k[2],
                "state_size": b["records"][0].get("state_size"), "value": b["value"],
                "half": b["interval"].half}
               for k, b in best.items() if not math.isnan(b["value"])]
        if pts:
            written.append(plots.recall_vs_state(
                pts, os.path.join(workdir, "recall_vs_state.png"),
                metric_label=f"{task.upper()} {metric} (95% interval over seeds)",
                references=[dict(r) for r in cfg.get("references", [])],
                bytes_per_number=report.BYTES_PER_NUMBER))
        if task == "niah":
            for k, b in best.items():
                cells = b["records"][0]["metrics"].get("grid", {}).get("cells")
                if cells:
                    written.append(plots.niah_heatmap(
                        cells, os.path.join(workdir, f"niah_{k[2]}_{k[3]}.png"),
                        title=f"{k[2]} {k[3]} (lr {b['lr']:g})"))
    elif task == "speed" and records:
        written.append(plots.speed_plot(speed_series(records),
                                        os.path.join(workdir, "speed.png")))
    return written


def write_atomic(path: str, text: str) -> None:
    """Whole file or nothing, also with several sweep processes (--shard) in one workdir."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def speed_series(records: list[dict]) -> dict[str, dict]:
    """{"train"|"decode": {mixer: [(T, seconds), ...]}}: training time per token, decode
    time per step, from speed records (several records of one mixer are merged)."""
    series: dict[str, dict] = {"train": {}, "decode": {}}
    for r in records:
        for kind in ("train", "decode"):
            pts = series[kind].setdefault(r["mixer"], [])
            pts += [(int(n), c["step_s"] / (int(n) if kind == "train" else 1))
                    for n, c in r["metrics"].get(kind, {}).items() if "step_s" in c]
    return series
