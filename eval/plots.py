"""PNG plots of eval results (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def niah_heatmap(cells: Sequence[dict], path: str,
                 title: str = "needle in a haystack") -> str:
    """Exact-match accuracy as a depth (rows) x length (columns) heatmap, values written
    in."""
    lengths = sorted({int(c["length"]) for c in cells})
    depths = sorted({float(c["depth"]) for c in cells})
    val = {(int(c["length"]), float(c["depth"])): float(c["exact"]) for c in cells}
    grid = [[val.get((n, d), math.nan) for n in lengths] for d in depths]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.0 + 0.45 * len(depths)))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="exact match")
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def seed_band(runs: Sequence[Sequence[tuple[int, float]]]) -> list[tuple]:
    """(step, mean, lowest, highest, n) at every step some run of `runs` evaluated, over
    the runs that reached it (seeds stop early at different steps)."""
    at: dict[int, list[float]] = defaultdict(list)
    for pts in runs:
        for step, loss in pts:
            at[int(step)].append(float(loss))
    return [(step, sum(v) / len(v), min(v), max(v), len(v)) for step, v in sorted(at.items())]


def loss_curves(curves: dict[str, Sequence[Sequence[tuple[int, float]]]], path: str,
                ylabel: str = "validation loss (nats/token)") -> str:
    """One line per name: loss against training step, the mean over its runs (seeds),
    with the band from their lowest to highest where there are several."""
    # the legend beside the axes, not over the curves (13 mixers' names cover them)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    drawn = [(name, [pts for pts in runs if pts]) for name, runs in sorted(curves.items())]
    drawn = [(name, runs) for name, runs in drawn if runs]
    for i, (name, runs) in enumerate(drawn):
        band = seed_band(runs)
        xs, mean, lo, hi, _ = zip(*band)
        label = name if len(runs) == 1 else f"{name} (mean of {len(runs)} seeds, min-max)"
        # ten colours, then the same ten dashed, then dotted: no two lines alike up to 30
        (line,) = ax.plot(xs, mean, marker=".", label=label, color=plt.cm.tab10(i % 10),
                          linestyle=("-", "--", ":")[(i // 10) % 3])
        if len(runs) > 1:
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              handlelength=3.5)  # long enough to show a dash
    return _save(fig, path)


def mixer_colors(names: Sequence[str]) -> dict:
    """{name: RGBA}, distinct for up to 20 names: tab10 up to ten, tab20 up to twenty
    (past that, colours repeat)."""
    cmap, n_colors = (plt.cm.tab10, 10) if len(names) <= 10 else (plt.cm.tab20, 20)
    return {m: cmap(i % n_colors) for i, m in enumerate(names)}


def recall_vs_state(points: Sequence[dict], path: str, metric_label: str = "MQAR accuracy",
                    references: Sequence[dict] = (), bytes_per_number: int = 4) -> str:
    """Zoology's recall-memory figure: accuracy against decode state size (log x), by mixer.

    `points`: dicts with `setting`, `mixer`, `state_size` (numbers per sequence), `value`
    and optionally `half` (the half-width of its 95% interval over seeds, drawn as an
    error bar; NaN or absent: none) and `partial` (True: not every lr of its grid ran, so
    the value is a lower bound; drawn hollow); one panel per setting. The bottom axis counts
    numbers, the top one Zoology's bytes (numbers x `bytes_per_number`, zoology/model.py).
    `references`: published points (dicts with `mixer`, `state_size` in numbers, `value`,
    optional `source`, `label` (the legend's name, else the mixer's) and `setting` (the
    panel they belong to; absent: every panel)), drawn as hollow stars in the mixer's
    colour.
    """
    by_setting = defaultdict(list)
    for p in points:
        by_setting[p["setting"]].append(p)
    settings = list(by_setting)
    mixers = sorted({p["mixer"] for p in points} | {r["mixer"] for r in references})
    colors = mixer_colors(mixers)
    # wide enough for the legend beside the last panel, where it hides no point
    fig, axes = plt.subplots(1, max(len(settings), 1),
                             figsize=(4.2 * max(len(settings), 1) + 2.2, 4.1),
                             squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for m in mixers:
            pts = sorted((p["state_size"], p["value"], p.get("half", math.nan))
                         for p in by_setting[setting]
                         if p["mixer"] == m and p["state_size"])
            if pts:
                xs, ys, hs = zip(*pts)
                if any(math.isfinite(h) for h in hs):
                    err = [h if math.isfinite(h) else 0.0 for h in hs]
                    ax.errorbar(xs, ys, yerr=err, marker="o", color=colors[m], label=m,
                                capsize=3)
                else:
                    ax.plot(xs, ys, marker="o", color=colors[m], label=m)
            for p in by_setting[setting]:
                if p["mixer"] == m and p["state_size"] and p.get("partial"):
                    ax.plot([p["state_size"]], [p["value"]], linestyle="none", marker="o",
                            markersize=7, markerfacecolor="white", color=colors[m],
                            zorder=5)
        if any(p.get("partial") for p in by_setting[setting]):
            ax.plot([], [], linestyle="none", marker="o", markerfacecolor="white",
                    color="gray", label="hollow: not every lr run (a lower bound)")
        for r in references:
            if r.get("setting") not in (None, setting):
                continue
            ax.plot([r["state_size"]], [r["value"]], linestyle="none", marker="*",
                    markersize=11, markerfacecolor="none", color=colors[r["mixer"]],
                    label=f"{r.get('label', r['mixer'])} ({r.get('source', 'reference')})")
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.05)
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("decode state size (numbers per sequence)")
        top = ax.secondary_xaxis("top", functions=(lambda x: x * bytes_per_number,
                                                   lambda x: x / bytes_per_number))
        top.set_xlabel(f"state size (bytes, {bytes_per_number} per number: Zoology's axis)",
                       fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric_label)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return _save(fig, path)


def speed_plot(series: dict[str, dict[str, Sequence[tuple[int, float]]]], path: str) -> str:
    """Log-log time against sequence length: one panel per kind (e.g. 'train', 'decode').

    `series[kind][mixer] = [(T, seconds), ...]`.
    """
    kinds = [k for k in series if any(pts for pts in series[k].values())]
    fig, axes = plt.subplots(1, max(len(kinds), 1), figsize=(5.0 * max(len(kinds), 1), 3.8),
                             squeeze=False)
    labels = {"train": "training step time per token (s)",
              "decode": "decode step time (s, whole batch)"}
    for ax, kind in zip(axes[0], kinds):
        for mixer, pts in sorted(series[kind].items()):
            pts = sorted((t, s) for t, s in pts if s and s > 0)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=mixer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence / context length T (tokens)")
        ax.set_ylabel(labels.get(kind, kind))
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return _save(fig, path)
