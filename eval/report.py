"""Tables for a comparison sweep: best learning rate per (task, setting, mixer, size), as
Markdown.

A sweep record (one line of results.jsonl) holds at least `task, setting, mixer, size,
lr, seed, metrics` plus the model's `d_model, layers, state_size, params`. As Zoology
does, a table shows for each (task, setting, mixer, size) the learning rate whose mean
over seeds is best, and that mean.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

# The number each task is judged by, and whether larger is better. Language models by
# their best validation loss during training (nanoGPT's figure): with early stopping the
# final evaluation is of parameters trained well past the best (6 evaluations, 1,500
# steps, in compare_shakespeare), so it measures how fast a mixer overfits, not how good it
# gets. Runs that logged no evaluation during training fall back to the final val_loss.
PRIMARY = {
    "lm": ("best_val_loss", False),
    "mqar": ("accuracy", True),
    "niah": ("exact", True),
}
FALLBACK = {"best_val_loss": "val_loss"}


def primary(task: str) -> tuple[str, bool]:
    if task not in PRIMARY:
        raise ValueError(f"task {task!r} has no primary metric; known: {sorted(PRIMARY)}")
    return PRIMARY[task]


def metric_value(record: dict, name: str):
    """record's metric `name`, or its FALLBACK where the record lacks it (None if
    neither)."""
    metrics = record.get("metrics", {})
    value = metrics.get(name)
    if value is None and name in FALLBACK:
        value = metrics.get(FALLBACK[name])
    return value


def best_lr(records: Iterable[dict]) -> dict[tuple, dict]:
    """For each (task, setting, mixer, size): the lr with the best mean primary metric.

    Returns {key: {"lr", "value" (mean over seeds), "seeds", "records" (those of that lr)}}.
    Records whose metric is missing or NaN (a diverged run) never win; a group where
    every lr diverged keeps value NaN.
    """
    by_group: dict[tuple, dict[float, list]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("task") not in PRIMARY:
            continue
        key = (r["task"], r["setting"], r["mixer"], r["size"])
        by_group[key][float(r["lr"])].append(r)
    out = {}
    for key, by_lr in by_group.items():
        name, higher = primary(key[0])
        best = None
        for lr in sorted(by_lr):
            vals = [metric_value(r, name) for r in by_lr[lr]]
            vals = [float(v) for v in vals if v is not None]
            mean = sum(vals) / len(vals) if vals else math.nan
            if math.isnan(mean):
                continue
            if best is None or (mean > best["value"] if higher else mean < best["value"]):
                best = {"lr": lr, "value": mean, "seeds": len(vals), "records": by_lr[lr]}
        if best is None:
            lr = sorted(by_lr)[0]
            best = {"lr": lr, "value": math.nan, "seeds": len(by_lr[lr]),
                    "records": by_lr[lr]}
        out[key] = best
    return out


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if x != 0 and abs(x) < 1e-3:
            return f"{x:.2e}"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(c) for c in row) + " |")
    return "\n".join(lines)


def _ordered(values: Iterable[str], order: Sequence[str]) -> list[str]:
    vals = list(dict.fromkeys(values))
    rank = {v: i for i, v in enumerate(order)}
    return sorted(vals, key=lambda v: rank.get(v, len(rank)))


def lm_table(records: list[dict], best: dict) -> str:
    rows = []
    for (task, setting, mixer, size), b in best.items():
        if task != "lm":
            continue
        r0 = b["records"][0]
        m = lambda k: _mean([r["metrics"].get(k) for r in b["records"]])  # noqa: E731
        best_loss = _mean([metric_value(r, "best_val_loss") for r in b["records"]])
        rows.append([mixer, size, r0.get("layers"), r0.get("params"), r0.get("state_size"),
                     b["lr"], best_loss, m("val_loss"), m("perplexity"),
                     m("bits_per_byte"),
                     _mean([r.get("tokens_per_s") for r in b["records"]]),
                     _mean([r.get("wall_s") for r in b["records"]])])
    rows.sort(key=lambda r: (r[6] if r[6] is not None else math.inf))
    return md_table(["mixer", "size", "layers", "params", "state_size", "best lr",
                     "best val loss", "val loss at stop", "perplexity at stop",
                     "bits/byte at stop", "train tokens/s", "wall s"], rows)


def recall_table(records: list[dict], best: dict, task: str,
                 settings_order: Sequence[str]) -> str:
    """Rows (mixer, size), one column per setting: the primary metric at the best lr."""
    cells: dict[tuple, dict] = defaultdict(dict)
    info: dict[tuple, dict] = {}
    for (t, setting, mixer, size), b in best.items():
        if t != task:
            continue
        cells[(mixer, size)][setting] = (b["value"], b["lr"])
        info[(mixer, size)] = b["records"][0]
    settings = _ordered([s for c in cells.values() for s in c], settings_order)
    rows = []
    for (mixer, size), by_setting in sorted(cells.items()):
        r0 = info[(mixer, size)]
        row = [mixer, size, r0.get("state_size")]
        for s in settings:
            v = by_setting.get(s)
            row.append("-" if v is None else f"{_fmt(v[0])} (lr {v[1]:g})")
        rows.append(row)
    return md_table(["mixer", "size", "state_size"] + settings, rows)


def _at_length(grid: dict, length: int | None):
    """Mean exact match over the depths at one context length (None if not evaluated)."""
    vals = [c["exact"] for c in grid.get("cells", []) if int(c["length"]) == length]
    return sum(vals) / len(vals) if vals else None


def niah_summary_table(best: dict) -> str:
    """Per (mixer, size) at its best lr: exact match at the training length (the number
    the hybrid-vs-softmax comparison is judged by) and over the whole grid, for the
    passkey needles and, where evaluated, the multi-key ones."""
    rows = []
    for (task, setting, mixer, size), b in sorted(best.items()):
        if task != "niah":
            continue
        recs = b["records"]
        m0 = recs[0]["metrics"]
        train_len = m0.get("grid", {}).get("train_length")
        at = lambda key: _mean(  # noqa: E731
            [_at_length(r["metrics"].get(key, {}), train_len) for r in recs])
        rows.append([mixer, size, setting, recs[0].get("state_size"), b["lr"], train_len,
                     at("grid"), at("grid_multikey"),
                     _mean([r["metrics"].get("exact") for r in recs]),
                     _mean([r["metrics"].get("exact_multikey") for r in recs])])
    return md_table(["mixer", "size", "setting", "state_size", "lr", "train length",
                     "passkey @train length", "multi-key @train length", "passkey (grid)",
                     "multi-key (grid)"], rows)


def niah_grid_table(record: dict) -> str:
    """Depth x length exact-match table of one NIAH record (metrics['grid'])."""
    grid = record["metrics"].get("grid", {})
    lengths = sorted({int(c["length"]) for c in grid.get("cells", [])})
    depths = sorted({float(c["depth"]) for c in grid.get("cells", [])})
    val = {(int(c["length"]), float(c["depth"])): c["exact"] for c in grid.get("cells", [])}
    rows = [[f"{d:.2f}"] + [val.get((n, d)) for n in lengths] for d in depths]
    return md_table(["depth \\ length"] + [str(n) for n in lengths], rows)


def speed_table(records: list[dict]) -> str:
    rows = []
    contexts, train_ts = set(), set()
    for r in records:
        if r.get("task") == "speed":
            contexts |= {int(k) for k in r["metrics"].get("decode", {})}
            train_ts |= {int(k) for k in r["metrics"].get("train", {})}
    contexts, train_ts = sorted(contexts), sorted(train_ts)
    for r in records:
        if r.get("task") != "speed":
            continue
        m = r["metrics"]
        row = [r["mixer"], r.get("params")]
        row += [_get(m, "train", t, "tokens_per_s") for t in train_ts]
        row += [_get(m, "decode", c, "tokens_per_s") for c in contexts]
        row += [_get(m, "decode", c, "state_bytes") for c in contexts]
        rows.append(row)
    header = (["mixer", "params"] + [f"train tok/s T={t}" for t in train_ts]
              + [f"decode tok/s @{c}" for c in contexts]
              + [f"state bytes @{c}" for c in contexts])
    return md_table(header, rows)


def _get(m: dict, kind: str, key: int, field: str):
    cell = m.get(kind, {}).get(str(key))
    if cell is None:
        cell = m.get(kind, {}).get(key)
    if not cell:
        return None
    if field in cell:
        return cell[field]
    err = str(cell.get("error", ""))
    return "skipped" if err.startswith("skipped") else f"failed ({err.split(':')[0][:40]})"


def _mean(vals):
    vals = [float(v) for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def markdown(records: list[dict], *, title: str, settings_order: Sequence[str] = (),
             plots: Sequence[str] = (), failed: Sequence[str] = ()) -> str:
    """The whole results.md of one sweep: a table per task present, then the plots."""
    best = best_lr(records)
    tasks = _ordered([r["task"] for r in records], ["lm", "mqar", "niah", "speed"])
    n_done = sum(1 for r in records if not r.get("partial"))
    parts = [f"# {title}", "", f"{n_done} finished runs. Tables show, for each "
             "(setting, mixer, size), the learning rate with the best mean over seeds."]
    for task in tasks:
        parts.append("")
        if task == "lm":
            parts += ["## Language modelling (validation loss, nats/token)", "",
                      lm_table(records, best)]
        elif task == "mqar":
            parts += ["## MQAR accuracy", "",
                      recall_table(records, best, "mqar", settings_order)]
        elif task == "niah":
            parts += ["## Needle in a haystack (exact match of all digits)", "",
                      niah_summary_table(best), "",
                      "Mean over the whole depth x length grid, passkey:", "",
                      recall_table(records, best, "niah", settings_order)]
            for key, b in sorted(best.items()):
                if key[0] == "niah":
                    parts += ["", f"### {key[2]} {key[3]} (lr {b['lr']:g}): exact match "
                              "by depth x length", "", niah_grid_table(b["records"][0])]
        elif task == "speed":
            parts += ["## Speed", "", speed_table(records)]
    if failed:
        parts += ["", "## Failed or incomplete runs (retried on the next invocation)", ""]
        parts += [f"- {f}" for f in failed]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"
