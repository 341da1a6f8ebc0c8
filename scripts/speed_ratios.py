"""Each mixer's tokens/s as a multiple of softmax's, round by round, with a 95% interval.

    python scripts/speed_ratios.py PATH [PATH ...] [--base softmax]

Reads the given JSON files and every train_speed.json under the given folders
(scripts/train_speed.py's output; e.g. the rounds of
docs/measurements/session32/next_speed_samples.sh). A row is named
`<row>_<mixer><tag>` ("shake_based_r1"); rows with the same row kind and tag are one
round, measured in one job, so each round gives one ratio per mixer (its tokens/s over
the base mixer's of the same round), and the ratios' mean gets the 95% t-interval of
eval.intervals. A ratio is a within-round figure: rounds from different jobs or cards
should not be mixed in one call.

Also reads round-robin outputs (`*.txt` under the folders, or named: the lines
`scripts/cpu_step_work.py --variant ...` prints, "<ms> wall ms/step (...), compile ...
<overrides>"), where one process timed every variant in turn: each file is one round, a
variant's ratio is the base's ms a step over its own (tokens/s, the batch being the
same), and files that timed the same variants are rounds of one row, named by the first
file. A variant is named by its overrides less those every variant of its file shares,
"model.mixer=" dropped ("based", "gated_deltanet model.softmax_every=8").
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from eval import intervals  # noqa: E402  (the repository's modules, run as a script)

ROW_KINDS = ("shake", "d1024_T2048", "d1024_T8192")


def split_name(name: str, mixers: set[str]) -> tuple[str, str, str] | None:
    """(row kind, mixer, tag) of a train_speed row name, or None for another row."""
    for kind in ROW_KINDS:
        if name.startswith(kind + "_"):
            rest = name[len(kind) + 1:]
            # the longest mixer name the rest starts with: "hedgehog_window_r0" is
            # hedgehog_window's row, not hedgehog's with the tag "_window_r0"
            for mixer in sorted(mixers, key=len, reverse=True):
                if rest == mixer or rest.startswith(mixer + "_"):
                    return kind, mixer, rest[len(mixer):]
    return None


def ratios(rows: dict[str, dict], base: str) -> dict[tuple[str, str], list[float]]:
    """{(row kind, mixer): [tokens/s over the base's, one per round]}, rounds matched by
    row kind and tag; rounds without the base or with a failed row are left out."""
    import models.mixers  # noqa: F401  (registers every mixer)
    from models.mixers import registry
    mixers = set(registry.MIXERS)
    rounds: dict[tuple[str, str], dict[str, float]] = {}
    for name, rec in rows.items():
        parts = split_name(name, mixers)
        if parts is None or not rec.get("tokens_per_s"):
            continue
        kind, mixer, tag = parts
        rounds.setdefault((kind, tag), {})[mixer] = float(rec["tokens_per_s"])
    out: dict[tuple[str, str], list[float]] = {}
    for (kind, _), by_mixer in sorted(rounds.items()):
        if base not in by_mixer:
            continue
        for mixer, rate in by_mixer.items():
            if mixer != base:
                out.setdefault((kind, mixer), []).append(rate / by_mixer[base])
    return out


# A line of cpu_step_work.py's round-robin table: ms a step, then the variant's overrides.
STEP_LINE = re.compile(r"^\s*([\d.]+) (?:wall|CPU) ms/step \(.*\), compile [\d.]+ "
                       r"(?:wall|CPU) s  (.*)$")


def step_times(text: str) -> dict[str, float]:
    """{variant name: ms a step} of one round-robin output (module docstring)."""
    timed = [(m.group(2).split(), float(m.group(1)))
             for m in map(STEP_LINE.match, text.splitlines()) if m]
    shared = set.intersection(*(set(o) for o, _ in timed)) if len(timed) > 1 else set()
    out = {}
    for overrides, ms in timed:
        own = [o.removeprefix("model.mixer=") for o in overrides if o not in shared]
        out[" ".join(own) or "defaults"] = ms
    return out


def step_ratios(texts: list[tuple[str, str]], base: str) -> dict[tuple[str, str], list[float]]:
    """{(row, variant): [base ms / variant ms, one per file]} of round-robin outputs
    ([(file name, text)]: files of one name from several calls are several rounds);
    files without the base variant are left out."""
    rows: dict[tuple[str, ...], tuple[str, list[dict[str, float]]]] = {}
    for name, text in texts:
        times = step_times(text)
        if base in times:
            key = tuple(sorted(times))
            rows.setdefault(key, (name, []))[1].append(times)
    out: dict[tuple[str, str], list[float]] = {}
    for row, rounds in rows.values():
        for times in rounds:
            for variant, ms in times.items():
                if variant != base:
                    out.setdefault((row, variant), []).append(times[base] / ms)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+",
                    help="train_speed.json files or round-robin *.txt outputs, or folders "
                         "searched for both")
    ap.add_argument("--base", default="softmax")
    args = ap.parse_args(argv)
    rows: dict[str, dict] = {}
    paths = list(map(pathlib.Path, args.paths))
    files = [f for p in paths
             for f in ([p] if p.is_file() else sorted(p.rglob("train_speed.json")))
             if f.suffix != ".txt"]
    texts = [(f.stem, f.read_text()) for p in paths
             for f in ([p] if p.is_file() else sorted(p.rglob("*.txt"))) if f.suffix == ".txt"]
    found = step_ratios(texts, args.base)
    if not files and not found:
        sys.exit(f"error: no train_speed.json or round-robin output in {' '.join(args.paths)}")
    for f in files:
        rows.update(json.loads(f.read_text()))
    print(f"| row | mixer | x {args.base} per round | mean [95% interval] |\n|---|---|---|---|")
    for (kind, mixer), xs in {**ratios(rows, args.base), **found}.items():
        iv = intervals.mean_interval(xs)
        span = f"[{iv.lo:.3f}, {iv.hi:.3f}]" if iv.decided else "(one round)"
        print(f"| {kind} | {mixer} | {', '.join(f'{x:.3f}' for x in xs)} | "
              f"{iv.mean:.3f} {span} |")


if __name__ == "__main__":
    main()
