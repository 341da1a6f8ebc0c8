"""What a sweep directory shows: results.jsonl, results.md and the plots, rebuilt from
the runs' record files (sweeps.runner) in grid order."""
from __future__ import annotations

import json
import math
import os
import sys
import traceback
from typing import Mapping


def records_file(path: str) -> dict[str, dict]:
    """The records of a results.jsonl, by run name (empty when the file is absent). A line
    that does not parse is named on stderr and left out."""
    if not os.path.isfile(path):
        return {}
    found = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                found[rec["run"]] = rec
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                print(f"sweep: {path} line {number} left out ({type(e).__name__}: {e})",
                      file=sys.stderr)
    return found


def read_records(runs: list[dict], workdir: str, extra: Mapping[str, dict] | None = None
                 ) -> tuple[list[dict], list[str]]:
    """(records of finished and partial runs, one line per failed or partial run).

    A run's record file in its directory decides; `extra` (records by run name, e.g. from
    another copy of the sweep's results.jsonl) supplies the runs that have none here."""
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
        elif extra and run["name"] in extra:  # no record file here
            records.append(extra[run["name"]])
    return records, failed


def write_outputs(cfg: Mapping, runs: list[dict], workdir: str,
                  extra: Mapping[str, dict] | None = None) -> list[dict]:
    """results.jsonl, results.md and plots from every run's record file (and `extra`'s
    records of runs without one: read_records), in grid order."""
    from eval import report

    records, failed = read_records(runs, workdir, extra)
    results = os.path.join(workdir, "results.jsonl")
    keep_dropped_lines(results, {r["run"] for r in records})
    write_atomic(results, "".join(json.dumps(r) + "\n" for r in records))
    try:
        written = plot(cfg, records, workdir, grid_lrs(runs))
    except Exception as e:  # noqa: BLE001 (a plot must never lose the tables)
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"sweep: plotting failed: {type(e).__name__}: {e} "
              f"({os.path.basename(where.filename)}:{where.lineno})", file=sys.stderr)
        written = []
    md = report.markdown(records, title=cfg.get("title", f"Comparison: {cfg['task']}"),
                         settings_order=[s["name"] for s in cfg.get("settings") or []],
                         plots=[os.path.basename(p) for p in written], failed=failed,
                         metric=cfg.get("metric"))
    write_atomic(os.path.join(workdir, "results.md"), md)
    return records


def grid_lrs(runs: list[dict]) -> dict[tuple, set[float]]:
    """{(setting, mixer, size): the lrs the grid gives that cell}."""
    lrs: dict[tuple, set[float]] = {}
    for run in runs:
        if run.get("lr") is not None:  # timing runs (speed) have no lr
            lrs.setdefault((run["setting"], run["mixer"], run["size"]), set()).add(
                float(run["lr"]))
    return lrs


def recall_points(best: Mapping[tuple, dict], cell_lrs: Mapping[tuple, set[float]]
                  ) -> list[dict]:
    """The recall-vs-state scatter's points from report.best_lr's groups: each the best
    lr's mean over seeds with its 95% half-width; `partial` where the group ran fewer lrs
    than cell_lrs (grid_lrs) gives its cell."""
    return [{"setting": k[1], "mixer": k[2], "state_size": b["records"][0].get("state_size"),
             "value": b["value"], "half": b["interval"].half,
             "partial": len(b["by_lr"]) < len(cell_lrs.get(k[1:], ()))}
            for k, b in best.items() if not math.isnan(b["value"])]


def plot(cfg: Mapping, records: list[dict], workdir: str,
         cell_lrs: Mapping[tuple, set[float]] | None = None) -> list[str]:
    """The task's PNGs in `workdir`: loss curves (lm), recall against state size (mqar,
    niah) and heatmaps (niah), throughput by length (speed); returns their paths.
    cell_lrs (grid_lrs): a recall point whose cell has not run every lr of its grid is
    drawn hollow, its best lr so far (a lower bound)."""
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
        pts = recall_points(best, cell_lrs or {})
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


def keep_dropped_lines(results: str, kept_runs: set[str]) -> None:
    """Before results.jsonl is rewritten without some of its lines (their runs have no
    record file here: a directory copied without its run folders, or sweeps merged by
    hand), the file as it was goes to results.previous.jsonl, so no result is lost."""
    dropped = sorted(set(records_file(results)) - kept_runs)
    if not dropped:
        return
    previous = os.path.join(os.path.dirname(results), "results.previous.jsonl")
    with open(results) as f:
        write_atomic(previous, f.read())
    print(f"sweep: {len(dropped)} record(s) of results.jsonl have no run directory here "
          f"(first: {dropped[0]}); the old file is kept as {previous} (--records="
          f"{previous} puts them back in the tables)", file=sys.stderr)


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
