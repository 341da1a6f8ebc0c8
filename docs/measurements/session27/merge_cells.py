"""Issue 18's MQAR cells from several sessions as one table and one scatter.

Session 27 found the sweep directory of sessions 22-26 (runs/h200, ignored by git) gone
with the old checkout; what they published is their cell tables (cell_table.md). This
reads cell tables (the rows as published) and sweeps' results.jsonl (rows made by
session 22's cell_table.py; a results.jsonl joined with the earlier ones by run name), a
later source replacing an earlier one's cell, prints the merged table and draws the
recall-vs-state scatter from each cell's best lr (mean, 95% half-width, state) with
eval.plots.recall_vs_state, as the sweep's own report does.

    PYTHONPATH=$PWD python docs/measurements/session27/merge_cells.py OUT.png \\
        docs/measurements/session26/cell_table.md \\
        docs/measurements/session27/call_sweep1/results.jsonl
"""
import json
import re
import sys

from configs import compare_mqar_zoology
from docs.measurements.session22 import cell_table
from eval import plots, report

# a best-lr entry in a published row: **mean [lo, hi]** (or **mean** for one seed)
_BEST = re.compile(r"\*\*([0-9.]+)(?: \[(-?[0-9.]+), (-?[0-9.]+)\])?\*\*")


def table_rows(path):
    """{(mixer, size): (row, best mean, half-width, state)} of a published cell table,
    the row's new-seed interval marked where a seed ended below the stop
    (cell_table.below_stop)."""
    out = {}
    for line in open(path):
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) < 4 or not cols[2].replace(",", "").isdigit():
            continue  # the header, its rule, anything else
        best = _BEST.search(line)
        if best is None:
            raise ValueError(f"{path}: no best lr (bold) in row {line.strip()!r}")
        mean = float(best.group(1))
        half = (float(best.group(3)) - float(best.group(2))) / 2 if best.group(2) else float("nan")
        row = line.strip()
        seeds = [float(x) for x in cols[-3].split(" / ")]
        if cell_table.below_stop(seeds) and cell_table.BELOW_STOP_MARK not in cols[-2]:
            cols[-2] += cell_table.BELOW_STOP_MARK  # tables published before the mark
            row = "| " + " | ".join(cols) + " |"
        out[(cols[0], cols[1])] = (row, mean, half, int(cols[2].replace(",", "")))
    return out


def merged(paths):
    """Cell rows of the paths in order, a later path's cell replacing an earlier one's. A
    results.jsonl's cells are made from its records joined with every earlier
    results.jsonl's (by run name, the later record winning), so a cell whose lrs ran in
    different sessions is whole."""
    rows, records = {}, {}
    for path in paths:
        if path.endswith(".md"):
            rows.update(table_rows(path))
            continue
        with open(path) as f:
            new = [json.loads(line) for line in f if line.strip()]
        records.update({r["run"]: r for r in new})
        joined = cell_table.cell_rows_of(records.values())
        rows.update({key: joined[key] for key in {(r["mixer"], r["size"]) for r in new}})
    return rows


def main(png, *paths):
    rows = merged(paths)
    print(cell_table.HEADER)
    for key in sorted(rows, key=cell_table.cell_order):
        print(rows[key][0])
    print("\n" + cell_table.BELOW_STOP_NOTE)
    setting = compare_mqar_zoology.get_config("paper").settings[0]["name"]  # its one panel
    # a row with "-" for an lr: not every lr of the grid ran (drawn hollow)
    points = [{"setting": setting, "mixer": m, "state_size": state, "value": mean,
               "half": half, "partial": "| - |" in row}
              for (m, _), (row, mean, half, state) in rows.items()]
    plots.recall_vs_state(points, png,
                          metric_label="MQAR accuracy (95% interval over seeds)",
                          bytes_per_number=report.BYTES_PER_NUMBER)
    print(f"\n{len(rows)} cells; scatter: {png}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
