"""Tables for a comparison sweep: best learning rate per (task, setting, mixer, size), as
Markdown.

A sweep record (one line of results.jsonl) holds at least `task, setting, mixer, size,
lr, seed, metrics` plus the model's `d_model, layers, state_size, params`. As Zoology
does, a table shows for each (task, setting, mixer, size) the learning rate whose mean
over seeds is best, and that mean, with its 95% t-interval over the seeds
(eval.intervals). Within one setting and width, the best mixer is marked [best] and every
mixer whose interval overlaps the best's [tie]: the table does not rank those; [?] marks
a comparison with fewer than 2 seeds on a side, which nothing decides.

The number a task is judged by is PRIMARY's, or the sweep config's `metric` (the Based-era
MQAR recipe judges by `settings_mean`, the mean accuracy over its test settings, as
Zoology's valid/accuracy is; sweeps.tasks measures it).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

from eval import intervals

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


# Zoology's x-axis: state in bytes, 4 per number (zoology/model.py, state_size * 4).
BYTES_PER_NUMBER = 4
LEGEND = ("Cells: mean over seeds at the best lr ± the half-width of its 95% t-interval "
          "(n seeds). [best]: the best mean of its setting and width; [tie]: its interval "
          "overlaps the best's, so the two are not ranked; [?]: one side has fewer than 2 "
          "seeds, so nothing is decided.")


def primary(task: str, metric: str | None = None) -> tuple[str, bool]:
    """(metric name, higher is better) a task is judged by; `metric` (a sweep config's)
    replaces the task's own, keeping its direction."""
    if task not in PRIMARY:
        raise ValueError(f"task {task!r} has no primary metric; known: {sorted(PRIMARY)}")
    name, higher = PRIMARY[task]
    return (metric or name), higher


def metric_value(record: dict, name: str):
    """record's metric `name`, or its FALLBACK where the record lacks it (None if
    neither)."""
    metrics = record.get("metrics", {})
    value = metrics.get(name)
    if value is None and name in FALLBACK:
        value = metrics.get(FALLBACK[name])
    return value


def best_lr(records: Iterable[dict], metric: str | None = None) -> dict[tuple, dict]:
    """For each (task, setting, mixer, size): the lr with the best mean primary metric
    (`metric` if given).

    Returns {key: {"lr", "value" (mean over seeds), "seeds", "records" (those of that lr),
    "interval" (eval.intervals.Interval of that lr's seeds), "by_lr" ({lr: Interval}),
    "records_by_lr" ({lr: that lr's records})}}.
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
        name, higher = primary(key[0], metric)
        best = None
        ivs = {}
        for lr in sorted(by_lr):
            vals = [metric_value(r, name) for r in by_lr[lr]]
            vals = [float(v) for v in vals if v is not None]
            mean = sum(vals) / len(vals) if vals else math.nan
            ivs[lr] = intervals.mean_interval(vals)
            if math.isnan(mean):
                continue
            if best is None or (mean > best["value"] if higher else mean < best["value"]):
                best = {"lr": lr, "value": mean, "seeds": len(vals), "records": by_lr[lr]}
        if best is None:
            lr = sorted(by_lr)[0]
            best = {"lr": lr, "value": math.nan, "seeds": len(by_lr[lr]),
                    "records": by_lr[lr]}
        best["interval"] = ivs[best["lr"]]
        best["by_lr"] = ivs
        best["records_by_lr"] = dict(by_lr)
        out[key] = best
    return out


def marks_within(points: dict, group_of, higher: bool = True,
                 alone: bool = True) -> dict:
    """{name: "best" | "tie" | "?" | ""} of each Interval in `points` ({name: Interval})
    against the best of its group (group_of(name)): eval.intervals.marks within every
    group. alone=False leaves a group of one point unmarked (nothing to compare with)."""
    groups: dict[Any, list] = defaultdict(list)
    for name in points:
        groups[group_of(name)].append(name)
    out = {}
    for members in groups.values():
        if alone or len(members) > 1:
            out.update(zip(members, intervals.marks([points[m] for m in members], higher)))
    return out


def column_marks(best: dict, task: str) -> dict[tuple, str]:
    """{key: "best" | "tie" | "?" | ""} of each point against the best mixer of its
    (setting, size)."""
    return marks_within({key: b["interval"] for key, b in best.items() if key[0] == task},
                        lambda key: (key[1], key[3]), PRIMARY[task][1])


def _cell(b: dict, mark: str = "") -> str:
    """"0.912 (lr 0.001) ± 0.031 (n 3) [best]": the best lr's mean, then its interval."""
    iv = b["interval"]
    text = f"{_fmt(b['value'])} (lr {b['lr']:g})"
    if iv.decided:
        text += f" ± {iv.half:.3f} (n {iv.n})"
    elif iv.n:
        text += f" (n {iv.n}, no interval)"
    return text + (f" [{mark}]" if mark else "")


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
    """Rows (mixer, size) by best validation loss, lowest first; the interval column
    marked against the lowest of the same setting and width ([best], [tie], [?]), since
    a gap inside the seeds' intervals ranks nothing; then where one more seed should
    land (eval.intervals.prediction_interval), what a re-run is checked against."""
    rows = []
    marks = column_marks(best, "lm")
    for key, b in best.items():
        task, setting, mixer, size = key
        if task != "lm":
            continue
        mark = f" [{marks[key]}]" if marks.get(key) else ""
        r0 = b["records"][0]
        m = lambda k: _mean([r["metrics"].get(k) for r in b["records"]])  # noqa: E731
        losses = [metric_value(r, "best_val_loss") for r in b["records"]]
        new_seed = intervals.prediction_interval(losses)
        rows.append([mixer, size, r0.get("layers"), r0.get("params"), r0.get("state_size"),
                     b["lr"], _mean(losses), _half(b["interval"]) + mark,
                     f"[{new_seed.lo:.3f}, {new_seed.hi:.3f}]" if new_seed.decided else "-",
                     m("val_loss"),
                     m("perplexity"), m("bits_per_byte"),
                     _mean([r.get("tokens_per_s") for r in b["records"]]),
                     _mean([r.get("wall_s") for r in b["records"]])])
    rows.sort(key=lambda r: (r[6] if r[6] is not None else math.inf))
    return md_table(["mixer", "size", "layers", "params", "state_size", "best lr",
                     "best val loss", "± 95% (n seeds)", "a new seed, 95%", "val loss at stop",
                     "perplexity at stop", "bits/byte at stop", "train tokens/s", "wall s"],
                    rows)


def _half(iv: intervals.Interval) -> str:
    """"± 0.031 (n 3)", or "n 1, no interval"."""
    if iv.decided:
        return f"± {iv.half:.3f} (n {iv.n})"
    return f"n {iv.n}, no interval" if iv.n else "-"


def recall_table(records: list[dict], best: dict, task: str,
                 settings_order: Sequence[str]) -> str:
    """Rows (mixer, size), one column per setting: the primary metric at the best lr with
    its 95% interval over seeds, marked against the best mixer of that setting and width
    (column_marks). The decode state in numbers per sequence and in Zoology's bytes."""
    cells: dict[tuple, dict] = defaultdict(dict)
    info: dict[tuple, dict] = {}
    marks = column_marks(best, task)
    for key, b in best.items():
        t, setting, mixer, size = key
        if t != task:
            continue
        cells[(mixer, size)][setting] = _cell(b, marks.get(key, ""))
        info[(mixer, size)] = b["records"][0]
    settings = _ordered([s for c in cells.values() for s in c], settings_order)
    rows = []
    for (mixer, size), by_setting in sorted(cells.items()):
        r0 = info[(mixer, size)]
        state = r0.get("state_size")
        row = [mixer, size, state, None if state is None else BYTES_PER_NUMBER * state]
        row += [by_setting.get(s, "-") for s in settings]
        rows.append(row)
    return md_table(["mixer", "size", "state (numbers)", "state (bytes, Zoology)"]
                    + settings, rows)


# A seed "learns" a recall task when its result at the best lr reaches half: MQAR's
# accuracy and NIAH's headline exact match at the training length. Runs are mostly all or
# nothing (MQAR's 0.064 or 0.996 of one recipe; NIAH above 0.9 or under 0.05), so the
# count of seeds that learn separates "fails more often" from "is worse on average".
LEARNED_AT = 0.5


def learned_count(values: Iterable[Any]) -> tuple[int, int]:
    """(seeds at LEARNED_AT or above, seeds with a result): a run without a finite result
    (not evaluated, diverged) is left out of both, as the intervals leave it out."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(v >= LEARNED_AT for v in finite), len(finite)


def against_most_reliable(counts: dict[tuple, tuple[int, int]]) -> dict[tuple, str]:
    """{(task, setting, mixer, size): (successes, runs)} -> for each key, its count set
    against the most reliable key of the same setting and width (the larger fraction;
    among equal ones, the more runs) by Fisher's exact test (eval.intervals.fisher_exact,
    two-sided; p >= 0.05: the rates are not told apart), or "-" for that key itself."""
    def reliability(key):
        k, n = counts[key]
        return (k / n, n)
    top: dict[tuple, tuple] = {}
    for key, (_, n) in counts.items():
        group = (key[1], key[3])
        if n and (group not in top or reliability(key) > reliability(top[group])):
            top[group] = key
    out = {}
    for key, (k, n) in counts.items():
        ref = top.get((key[1], key[3]))
        if ref is None or ref == key:
            out[key] = "-"
        else:
            rk, rn = counts[ref]
            out[key] = f"{ref[2]} ({rk} of {rn}): p {intervals.fisher_exact(k, n, rk, rn):.3g}"
    return out


def by_seed_table(best: dict, task: str, metric: str | None = None) -> str:
    """Per (mixer, size, setting) at its best lr: the primary metric (`metric` if given) of
    each seed, "seed: value" in seed order. MQAR learning is a sudden drop whose step
    varies by seed, so a mean with a wide interval is often one run that never learned the
    task beside runs that did; the means alone cannot say which. Last, where one more
    seed should land (eval.intervals.prediction_interval, 95%, its spread at least the
    binomial one of the queries scored): what a re-run with an unused seed is checked
    against, twice as wide as the mean's interval at 3 seeds."""
    name, _ = primary(task, metric)
    cells, counts = [], {}
    for key, b in sorted(best.items()):
        if key[0] != task:
            continue
        runs = sorted(b["records"], key=lambda r: r.get("seed", 0))
        values = [metric_value(r, name) for r in runs]
        counts[key] = learned_count(values)
        new_seed = intervals.prediction_interval([v for v in values if v is not None],
                                                 trials=_scored_queries(runs, name))
        cells.append((key, b["lr"], ", ".join(
            f"{r.get('seed')}: {_fmt(v)}" for r, v in zip(runs, values)),
            _bounds(new_seed)))
    against = against_most_reliable(counts)
    rows = [[key[1], key[2], key[3], lr, by_seed, "{} of {}".format(*counts[key]),
             against[key], new_seed] for key, lr, by_seed, new_seed in cells]
    return md_table(["setting", "mixer", "size", "lr", f"{name} by seed",
                     f"seeds >= {LEARNED_AT:g}",
                     "against the most reliable (Fisher's exact)", "a new seed, 95%"],
                    sorted(rows))


def _scored_queries(runs: Sequence[dict], name: str) -> int | None:
    """The fewest queries a run's accuracy was scored on (MQAR's `queries`), the trials of
    its binomial floor (the queries of one example are not independent, so the floor is
    a low one); None for other metrics or where a record does not say."""
    if name != "accuracy":
        return None
    return _fewest([r.get("metrics", {}).get("queries") for r in runs])


def _fewest(counts: Sequence[int | None]) -> int | None:
    """The smallest of the runs' example counts, the trials of a binomial floor; None
    when there are none or any run does not say (no floor rather than a guessed one)."""
    if not counts or any(not c for c in counts):
        return None
    return int(min(counts))


def _bounds(iv: intervals.Interval) -> str:
    """"[0.875, 1.095] (n 2)", or "-" where there is no interval (fewer than 2 values)."""
    return f"[{iv.lo:.3f}, {iv.hi:.3f}] (n {iv.n})" if iv.decided else "-"


def _learned_value(record: dict, task: str, name: str):
    """What decides whether a run learned its recall task (LEARNED_AT): MQAR's metric
    `name`; NIAH's headline exact match at the training length."""
    if task == "niah":
        grid = record.get("metrics", {}).get("grid", {})
        return _at_length(grid, grid.get("train_length"))
    return metric_value(record, name)


def every_lr_table(best: dict, task: str, metric: str | None = None) -> str:
    """Every lr run of each (setting, mixer, size), not only the best: its mean primary
    metric with the 95% interval over seeds and how many seeds learned the task, the best
    lr marked. The tables above compare each mixer at its own best lr (Zoology's
    protocol), so a mixer given more lrs has more chances; this one shows each at every
    lr, and, where two or more mixers of a (setting, size) ran the same lr, marks each
    against the best of them at that lr ([best], [tie], [?]: eval.intervals). "" when no
    cell ran more than one lr."""
    name, higher = primary(task, metric)
    cells = {key: b for key, b in best.items() if key[0] == task}
    if all(len(b["records_by_lr"]) < 2 for b in cells.values()):
        return ""
    at_lr = marks_within({(key, lr): iv for key, b in cells.items()
                          for lr, iv in b["by_lr"].items()},
                         lambda key_lr: (key_lr[0][1], key_lr[0][3], key_lr[1]), higher,
                         alone=False)
    rows = []
    for key, b in sorted(cells.items()):
        for lr, runs in sorted(b["records_by_lr"].items()):
            learned = learned_count(_learned_value(r, task, name) for r in runs)
            rows.append([key[1], key[2], key[3], lr, intervals.fmt(b["by_lr"][lr]),
                         "{} of {}".format(*learned),
                         "best" if lr == b["lr"] else "", at_lr.get((key, lr), "")])
    # NIAH's primary metric is the headline task over the whole length x depth grid; a
    # seed counts as learned by that task at the training length (niah_retrieval_table)
    value, learned = ((f"{name} over the grid ± 95% (n seeds)",
                       f"seeds >= {LEARNED_AT:g} at the training length")
                      if task == "niah" else
                      (f"{name} ± 95% (n seeds)", f"seeds >= {LEARNED_AT:g}"))
    return md_table(["setting", "mixer", "size", "lr", value, learned, "best lr",
                     "against the mixers at this lr"], rows)


def settings_table(best: dict, task: str = "mqar") -> str:
    """Per (mixer, size, training setting) at its best lr: the mean accuracy over seeds at
    each test setting (metrics["settings"], sweeps.tasks) and their mean (Zoology's
    seven-setting figure when the Based-era recipe's seven are measured) with its 95%
    interval over seeds; "" when no record has test settings."""
    rows, names = [], []
    for (t, setting, mixer, size), b in sorted(best.items()):
        if t != task:
            continue
        per = [r["metrics"].get("settings") or {} for r in b["records"]]
        if not any(per):
            continue
        for p in per:
            names += [n for n in p if n not in names]
        means = {n: _mean([p.get(n) for p in per]) for n in names}
        iv = intervals.mean_interval(r["metrics"].get("settings_mean")
                                     for r in b["records"])
        rows.append((mixer, size, setting, b["lr"], means, iv))
    if not rows:
        return ""
    header = ["mixer", "size", "trained on", "lr"] + names + [
        f"mean of {len(names)} ± 95% (n seeds)"]
    return md_table(header, [[m, sz, st, lr] + [means.get(n) for n in names]
                             + [intervals.fmt(iv)] for m, sz, st, lr, means, iv in rows])


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
        half = lambda key: _half(intervals.mean_interval(  # noqa: E731
            _at_length(r["metrics"].get(key, {}), train_len) for r in recs))
        rows.append([mixer, size, setting, recs[0].get("state_size"), b["lr"], train_len,
                     at("grid"), at("grid_multikey"),
                     _mean([r["metrics"].get("exact") for r in recs]),
                     _mean([r["metrics"].get("exact_multikey") for r in recs]),
                     half("grid"), half("grid_multikey"), _half(b["interval"])])
    return md_table(["mixer", "size", "setting", "state_size", "lr", "train length",
                     "passkey @train length", "multi-key @train length", "passkey (grid)",
                     "multi-key (grid)", "passkey @train ± 95%", "multi-key @train ± 95%",
                     "passkey (grid) ± 95%"], rows)


def niah_task_grids(metrics: dict) -> dict[str, dict]:
    """{task name: grid} of one NIAH record: the headline grid ("grid", named by its
    `kind`, else passkey) and every `grid_<name>` (sweeps.tasks: one per eval.kinds)."""
    out = {}
    if "grid" in metrics:
        out[str(metrics["grid"].get("kind") or "passkey")] = metrics["grid"]
    for key, grid in metrics.items():
        if key.startswith("grid_") and isinstance(grid, dict):
            out.setdefault(key[len("grid_"):], grid)
    return out


def _at_length_of(grid: dict, length: int | None, key: str):
    """Mean of a cell metric over the depths at one length (None if not there)."""
    vals = [c[key] for c in grid.get("cells", [])
            if int(c["length"]) == length and key in c]
    return sum(vals) / len(vals) if vals else None


def _examples_at_length_of(grid: dict, length: int | None) -> int | None:
    """The examples a grid scored at one length, over its depths (None if its cells do
    not say)."""
    counts = [c.get("examples") for c in grid.get("cells", []) if int(c["length"]) == length]
    if not counts or any(c is None for c in counts):
        return None
    return int(sum(counts))


def niah_tasks_table(best: dict) -> str:
    """Per (mixer, size, setting) at its best lr, one column per NIAH task evaluated
    (configs/compare_niah.py:ruler's passkey, multikey, passkey7, mk2, mk3, mv): exact
    match at the training length, mean over seeds ± its 95% t-interval, marked against
    the best mixer of the same setting and width ([best], [tie], [?]: eval.intervals);
    multi-value tasks also by value (RULER's string_match_all). "" when the records hold
    no task beyond passkey and multi-key."""
    return _niah_tasks(_niah_best_lr_entries(best), lambda key, lr: (key[1], key[3]),
                       basic_tasks_too=False)


def _niah_best_lr_entries(best: dict) -> list[tuple]:
    """(key, lr, records) of each NIAH point at its best lr, in key order."""
    return [(key, b["lr"], b["records"]) for key, b in sorted(best.items())
            if key[0] == "niah"]


def niah_same_lr_table(best: dict) -> str:
    """Every NIAH task at the training length, mixers compared at one lr: for each lr that
    two or more mixers of a (setting, width) ran, each one's mean ± 95% t-interval there,
    marked against the best mixer at that lr. Each mixer at its own best lr (the tables
    above, Zoology's protocol) favours the mixer given more lrs and can hide a task on
    which another mixer's best lr (chosen by the headline task) was its worse one; at one
    lr both had the same chance. "" where no lr was run by two mixers."""
    groups: dict[tuple, list] = defaultdict(list)
    for key, b in sorted(best.items()):
        if key[0] != "niah":
            continue
        for lr, records in sorted(b["records_by_lr"].items()):
            groups[(key[1], key[3], lr)].append((key, lr, records))
    entries = [entry for _, members in sorted(groups.items()) if len(members) > 1
               for entry in members]
    return _niah_tasks(entries, lambda key, lr: (key[1], key[3], lr), basic_tasks_too=True)


def niah_new_seed_table(best: dict) -> str:
    """Every NIAH task at the training length, at each mixer's best lr: where one more
    seed should land (eval.intervals.prediction_interval, 95%, its spread at least the
    binomial one of the examples scored), the interval a re-run with an unused seed is
    checked against; the mean's interval (the tables above) holds a new seed only about
    5 times in 6 at 3 seeds."""
    return _niah_tasks(_niah_best_lr_entries(best), lambda key, lr: (key[1], key[3]),
                       basic_tasks_too=True, new_seed=True)


def _niah_tasks(entries: Sequence[tuple], group_of, basic_tasks_too: bool,
                new_seed: bool = False) -> str:
    """The table of niah_tasks_table / niah_same_lr_table / niah_new_seed_table: one row
    per (key, lr, records) entry, one column per task (and per value for multi-value
    tasks), each cell the mean's interval marked against the best row of its group
    (group_of(key, lr)), or with new_seed the unmarked prediction interval of one more
    seed. basic_tasks_too=False: "" when the records hold no task beyond passkey and
    multi-key (niah_summary_table has them)."""
    rows, names = [], []
    for key, lr, records in entries:
        grids = [niah_task_grids(r["metrics"]) for r in records]
        for g in grids:
            names += [n for n in g if n not in names]
        rows.append((key, lr, grids))
    if not rows or (not basic_tasks_too and set(names) <= {"passkey", "multikey"}):
        return ""
    columns = []  # (task name, cell metric, header)
    for n in names:
        columns.append((n, "exact", f"{n} @train"))
        if any("per_value" in g.get(n, {}) for _, _, gs in rows for g in gs):
            columns.append((n, "per_value", f"{n} per value @train"))
    ivs = {}
    for key, lr, grids in rows:
        for col in columns:
            n, metric, _ = col
            vals, trials = [], []
            for g in grids:
                grid = g.get(n, {})
                vals.append(_at_length_of(grid, grid.get("train_length"), metric))
                trials.append(_examples_at_length_of(grid, grid.get("train_length")))
            vals = [v for v in vals if v is not None]
            if new_seed:
                # a per-value score counts its examples too: the values of one example
                # are not independent
                ivs[key, lr, col] = intervals.prediction_interval(
                    vals, trials=_fewest(trials))
            else:
                ivs[key, lr, col] = intervals.mean_interval(vals)
    marks = {}
    if not new_seed:  # a new seed's interval is where one run lands: nothing to rank
        for col in columns:
            col_marks = marks_within({(key, lr): ivs[key, lr, col] for key, lr, _ in rows},
                                     lambda key_lr: group_of(*key_lr))
            marks.update({(key, lr, col): m for (key, lr), m in col_marks.items()})
    table = []
    for key, lr, _ in rows:
        _, setting, mixer, size = key
        row = [mixer, size, setting, lr]
        for col in columns:
            iv, mark = ivs[key, lr, col], marks.get((key, lr, col), "")
            if new_seed:
                row.append(_bounds(iv))
            else:
                row.append(intervals.fmt(iv) + (f" [{mark}]" if mark else ""))
        table.append(row)
    return md_table(["mixer", "size", "setting", "lr"] + [h for _, _, h in columns], table)


def niah_seeds_table(best: dict) -> str:
    """Each run of each (mixer, size, setting) at its best lr, by seed: exact match of
    every NIAH task at the training length, the headline task's per-digit accuracy over
    the grid (chance is 0.1: a run near it learned no retrieval) and the best validation
    loss. A mean with a wide interval can be one seed that failed outright while the
    others match the best mixer; this table tells which."""
    rows, names = [], []
    for (task, setting, mixer, size), b in sorted(best.items()):
        if task != "niah":
            continue
        for record in sorted(b["records"], key=lambda r: r.get("seed", 0)):
            grids = niah_task_grids(record["metrics"])
            names += [n for n in grids if n not in names]
            rows.append((mixer, size, setting, b["lr"], record, grids))
    if not rows:
        return ""
    table = []
    for mixer, size, setting, lr, record, grids in rows:
        at_train = [_at_length_of(grids.get(n, {}), grids.get(n, {}).get("train_length"),
                                  "exact") for n in names]
        table.append([mixer, size, setting, lr, record.get("seed")] + at_train
                     + [record["metrics"].get("per_digit"),
                        record["metrics"].get("best_val_loss")])
    return md_table(["mixer", "size", "setting", "lr", "seed"]
                    + [f"{n} @train" for n in names]
                    + ["per-digit (grid)", "best val loss"], table)


def niah_retrieval_table(best: dict) -> str:
    """Per (mixer, size, setting) at its best lr: how many seeds retrieve (the headline
    task's exact match at the training length >= LEARNED_AT), set against the mixer whose
    seeds retrieve most often (against_most_reliable)."""
    counts = {}
    for key, b in sorted(best.items()):
        if key[0] != "niah":
            continue
        counts[key] = learned_count(_learned_value(r, "niah", primary("niah")[0])
                                   for r in b["records"])
    if not counts:
        return ""
    against = against_most_reliable(counts)
    rows = [[key[2], key[3], key[1], best[key]["lr"], "{} of {}".format(*counts[key]),
             against[key]] for key in counts]
    return md_table(["mixer", "size", "setting", "lr", "seeds that retrieve",
                     "against the most reliable mixer (Fisher's exact, two-sided)"], rows)


def niah_grid_table(records: Sequence[dict]) -> str:
    """Depth x length exact-match table of one grid cell's runs (metrics['grid']): each
    cell the mean over the runs (seeds), so one failed seed shows as the drop it is."""
    vals: dict[tuple[int, float], list] = {}
    for record in records:
        for c in record["metrics"].get("grid", {}).get("cells", []):
            vals.setdefault((int(c["length"]), float(c["depth"])), []).append(c["exact"])
    lengths = sorted({n for n, _ in vals})
    depths = sorted({d for _, d in vals})
    rows = [[f"{d:.2f}"] + [_mean(vals.get((n, d), [])) for n in lengths] for d in depths]
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


EVERY_LR_TITLE = ("### Every lr (the tables above show each mixer at its best lr; "
                  "here every lr it ran)")
NEW_SEED_TITLE = ("### Where one more seed should land (95% prediction interval at the "
                  "best lr, its spread at least the binomial one of the examples scored; "
                  "every task at the training length; a re-run with an unused seed is "
                  "checked against it)")
SAME_LR_TITLE = ("### Every NIAH task with the mixers at one lr (each lr two or more "
                 "mixers ran; marks against the best at that lr)")


def markdown(records: list[dict], *, title: str, settings_order: Sequence[str] = (),
             plots: Sequence[str] = (), failed: Sequence[str] = (),
             metric: str | None = None) -> str:
    """The whole results.md of one sweep: a table per task present, then the plots.
    metric: what the best lr is chosen by and the tables show (the task's PRIMARY one when
    None)."""
    best = best_lr(records, metric)
    tasks = _ordered([r["task"] for r in records], ["lm", "mqar", "niah", "speed"])
    n_done = sum(1 for r in records if not r.get("partial"))
    parts = [f"# {title}", "", f"{n_done} finished runs. Tables show, for each "
             "(setting, mixer, size), the learning rate with the best mean over seeds."]
    if any(t != "speed" for t in tasks):
        parts += ["", LEGEND]
    for task in tasks:
        parts.append("")
        if task == "lm":
            parts += ["## Language modelling (validation loss, nats/token)", "",
                      lm_table(records, best)]
        elif task == "mqar":
            name = primary("mqar", metric)[0]
            what = "accuracy" if name == "accuracy" else f"accuracy ({name})"
            parts += [f"## MQAR {what}", "",
                      recall_table(records, best, "mqar", settings_order)]
            parts += ["", "### Each seed at the best lr", "",
                      by_seed_table(best, "mqar", metric)]
            every_lr = every_lr_table(best, "mqar", metric)
            if every_lr:
                parts += ["", EVERY_LR_TITLE, "", every_lr]
            per_setting = settings_table(best)
            if per_setting:
                parts += ["", "### Accuracy per test setting at the best lr (mean over "
                          "seeds)", "", per_setting]
        elif task == "niah":
            parts += ["## Needle in a haystack (exact match of all digits)", "",
                      niah_summary_table(best), "",
                      "Mean over the whole depth x length grid, passkey:", "",
                      recall_table(records, best, "niah", settings_order)]
            tasks_table = niah_tasks_table(best)
            if tasks_table:
                parts += ["", "### Every NIAH task at the training length (RULER's "
                          "MK-NIAH-2/3, multi-value, 7 digits; data/niah.py)", "",
                          tasks_table]
            parts += ["", "### Each seed at the training length (a seed that learns "
                      "no retrieval shows here, not in the means)", "",
                      niah_seeds_table(best)]
            parts += ["", NEW_SEED_TITLE, "", niah_new_seed_table(best)]
            parts += ["", f"### Seeds that retrieve (headline exact match >= "
                      f"{LEARNED_AT:g} at the training length)", "",
                      niah_retrieval_table(best)]
            every_lr = every_lr_table(best, "niah", metric)
            if every_lr:
                parts += ["", EVERY_LR_TITLE, "", every_lr]
            same_lr = niah_same_lr_table(best)
            if same_lr:
                parts += ["", SAME_LR_TITLE, "", same_lr]
            for key, b in sorted(best.items()):
                if key[0] == "niah":
                    parts += ["", f"### {key[2]} {key[3]} (lr {b['lr']:g}): exact match "
                              f"by depth x length, mean over {len(b['records'])} runs", "",
                              niah_grid_table(b["records"])]
        elif task == "speed":
            parts += ["## Speed", "", speed_table(records)]
    if failed:
        parts += ["", "## Failed or incomplete runs (retried on the next invocation)", ""]
        parts += [f"- {f}" for f in failed]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"
