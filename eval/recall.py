"""Recall of a trained run: MQAR by (sequence length, kv pairs), NIAH by (length, depth).

    python -m eval.recall --workdir=DIR --task=mqar \
        [--seq_lens=64,128,256,512 --num_examples=256]
    python -m eval.recall --workdir=DIR --task=niah \
        [--length_multiples=1,2,4,8 --num_depths=6 --kinds=passkey,mk2,mv]

Accuracy is teacher-forced: one forward pass per batch, then argmax(logits) == target
at the positions the mask marks (MQAR: the query positions; NIAH: the answer digits).
For NIAH, "exact" is the fraction of examples with every digit right (the same as
greedy decoding getting all digits, since greedy and teacher forcing agree until the
first wrong digit) and "per_digit" the fraction of digits right; with multi-value
needles (data.num_values > 1) "per_value" is the fraction of values with every digit right
(RULER's string_match_all). Each NIAH component of a mixture (MK-NIAH-2/3, multi-value,
7 digits: configs/compare_niah.py) is gridded with its own settings. Lengths beyond the
training length are included on purpose: they measure length generalisation.

Writes `recall_<task>.json` (and `niah_heatmap.png` for NIAH) into the workdir and
prints the JSON as the last line.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from data.base import cfg_get
from eval import common


# ----------------------------------------------------------------------------- scoring
def masked_accuracy(stats_fn,
                    batches: Iterable[Mapping[str, np.ndarray]]) -> tuple[int, int]:
    """(correct, total) over masked positions: argmax(logits) == target where mask > 0."""
    correct = total = 0
    for batch in batches:
        _, hit = stats_fn(batch)
        m = np.asarray(batch["mask"]) > 0
        correct += int(hit[m].sum())
        total += int(m.sum())
    return correct, total


def example_scores(stats_fn,
                   batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per example: (all masked positions right, fraction right); rows with no mask are
    NaN."""
    _, hit = stats_fn(batch)
    m = np.asarray(batch["mask"]) > 0
    n = m.sum(axis=1)
    right = (hit & m).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = np.where(n > 0, (right == n).astype(np.float64), np.nan)
        frac = np.where(n > 0, right / n, np.nan)
    return exact, frac


def _batched(examples: Mapping[str, np.ndarray], batch_size: int):
    n = len(examples["inputs"])
    for i in range(0, n, batch_size):
        b = {k: np.asarray(v[i:i + batch_size]) for k, v in examples.items()}
        if "segment_ids" not in b:
            b["segment_ids"] = np.ones_like(b["inputs"])
        yield b


# ----------------------------------------------------------------------------- MQAR
def default_mqar_settings(seq_lens: Sequence[int],
                          min_kv: int = 4) -> list[tuple[int, int]]:
    """(seq_len, kv) with kv = min_kv, 2 min_kv, ... up to seq_len / 4 (Zoology's bound)."""
    out = []
    for t in seq_lens:
        kv = min_kv
        while 4 * kv <= t:
            out.append((int(t), kv))
            kv *= 2
    return out


def mqar_task(config, dataset) -> dict[str, Any]:
    """The MQAR vocabulary of a run: task vocab, id offset, power law and filler (random
    tokens or 0s, as the run trained), from its dataset."""
    if hasattr(dataset, "task_vocab"):
        return {"vocab_size": int(dataset.task_vocab),
                "offset": int(getattr(dataset, "vocab_offset", 0)),
                "power_a": float(getattr(dataset, "power_a", 0.01)),
                "random_non_queries": bool(getattr(dataset, "random_non_queries", False))}
    source = cfg_get(config, "data.source")
    if source != "mqar":
        raise ValueError(f"--task=mqar needs a run trained on MQAR (data.source=mqar), "
                         f"this run has data.source={source!r}")
    return {"vocab_size": int(cfg_get(config, "data.vocab_size", 8192)), "offset": 0,
            "power_a": float(cfg_get(config, "data.power_a", 0.01)),
            "random_non_queries": bool(cfg_get(config, "data.random_non_queries", False))}


def mqar_grid(stats_fn, task: Mapping[str, Any], settings: Sequence[tuple[int, int]], *,
              num_examples: int = 256, batch_size: int = 64, seed: int = 1234,
              progress: bool = True) -> dict[str, Any]:
    """Accuracy per (seq_len, kv) on fresh examples (a seed no training stream uses)."""
    from data import mqar

    cells = []
    it = settings
    if progress:
        from tqdm import tqdm
        it = tqdm(settings, desc="mqar", unit="setting")
    for t, kv in it:
        if task["vocab_size"] <= t or 4 * kv > t:
            continue  # a shape the generator cannot make (vocab must exceed seq_len)
        ex = mqar.generate(np.random.default_rng([seed, t, kv]), num_examples, t, kv,
                           task["vocab_size"], task["power_a"],
                           bool(task.get("random_non_queries", False)))
        ex["inputs"] = ex["inputs"] + task["offset"]
        ex["targets"] = ex["targets"] + task["offset"]
        correct, total = masked_accuracy(stats_fn, _batched(ex, batch_size))
        cells.append({"seq_len": t, "kv_pairs": kv, "accuracy": correct / max(total, 1),
                      "queries": total})
    return {"task": "mqar", "cells": cells}


# ----------------------------------------------------------------------------- NIAH
def _is_niah(d) -> bool:
    return hasattr(d, "num_digits") and hasattr(d, "base_vocab") and hasattr(d, "kind")


def niah_components(dataset) -> dict[str, Any]:
    """The NIAH datasets of a run by name, in order: a mixture's NIAH components under
    their component names; a NIAH run's own dataset under its kind."""
    out: dict[str, Any] = {}
    seen, todo = set(), [(None, dataset)]
    while todo:
        name, d = todo.pop(0)
        if id(d) in seen:
            continue
        seen.add(id(d))
        if _is_niah(d):
            out.setdefault(name if name is not None else str(d.kind), d)
            continue
        for attr in ("components", "datasets", "parts"):
            sub = getattr(d, attr, None)
            if isinstance(sub, Mapping):
                todo += [(str(k), v) for k, v in sub.items()]
            elif isinstance(sub, (list, tuple)):
                todo += [(None, x[-1] if isinstance(x, tuple) else x) for x in sub]
    return out


def find_niah(dataset, name: str | None = None):
    """The NIAH dataset inside a run's dataset (itself, or a component of a mixture):
    the first one, or the component called `name`."""
    comps = niah_components(dataset)
    if not comps:
        raise ValueError("--task=niah needs a run trained with needles (data.source=niah, "
                         "or a mixture with a niah component); this run's dataset has none")
    if name is None:
        return next(iter(comps.values()))
    if name not in comps:
        raise ValueError(f"NIAH task {name!r}: this run's NIAH components are "
                         f"{', '.join(comps)}")
    return comps[name]


def niah_spec(dataset, kind: str | None = None) -> dict[str, Any]:
    """What one NIAH evaluation draws: the generator's settings and the text filler.

    kind: None (the run's first NIAH task), a mixture component's name (that component's
    needles: kind, haystack, values, digits, keys), or a kind of data.niah (passkey,
    multikey: the first NIAH task's settings with that kind)."""
    from data import niah

    comps = niah_components(dataset)
    if kind is not None and kind not in comps and kind not in niah.KINDS:
        raise ValueError(f"NIAH task {kind!r}: name one of this run's NIAH components "
                         f"({', '.join(comps) or 'none'}) or a kind "
                         f"({', '.join(niah.KINDS)})")
    d = find_niah(dataset, kind if kind in comps else None)
    spec = {"kind": d.kind if kind is None or kind in comps else kind,
            "num_keys": int(d.num_keys), "num_digits": int(d.num_digits),
            "key_vocab": int(d.key_vocab), "key_len": int(getattr(d, "key_len", 1)),
            "haystack": str(getattr(d, "haystack", "filler")),
            "num_values": int(getattr(d, "num_values", 1))}
    spec["_dataset"] = d
    return spec


def niah_generate(dataset, length: int, depth: float, num_examples: int, seed: int,
                  kind: str | None = None) -> dict:
    """NIAH examples of one (length, depth) cell, drawn like the run's own NIAH data
    (`kind` as niah_spec)."""
    from data import niah

    spec = niah_spec(dataset, kind)
    d = spec["_dataset"]
    ex = niah.generate(np.random.default_rng(seed), num_examples, int(length), float(depth),
                       spec["kind"], spec["num_keys"], d.filler_tokens, d.base_vocab,
                       d.filler_vocab, spec["num_digits"], spec["key_vocab"],
                       spec["key_len"], spec["haystack"], spec["num_values"])
    offset = int(getattr(d, "vocab_offset", 0))
    return {"inputs": ex["inputs"] + offset, "targets": ex["targets"] + offset,
            "mask": ex["mask"]}


def niah_scores(stats_fn, batch: Mapping[str, np.ndarray],
                num_values: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: (every answer digit right, fraction of digits right, fraction of
    values with every digit right: RULER's string_match_all, which credits each value
    of a multi-value answer found). A row whose masked digits do not split into
    num_values equal values gets NaN for the last; a row with no mask NaN for all."""
    _, hit = stats_fn(batch)
    m = np.asarray(batch["mask"]) > 0
    hit = np.asarray(hit) & m
    n = m.sum(axis=1)
    right = hit.sum(axis=1)
    per_value = np.full(len(n), np.nan)
    for i in range(len(n)):
        if n[i] and n[i] % num_values == 0:
            per_value[i] = hit[i][m[i]].reshape(num_values, -1).all(axis=1).mean()
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = np.where(n > 0, (right == n).astype(np.float64), np.nan)
        frac = np.where(n > 0, right / n, np.nan)
    return exact, frac, per_value


def niah_grid(stats_fn, config, dataset, *, lengths: Sequence[int] | None = None,
              length_multiples: Sequence[int] = (1, 2, 4, 8), num_depths: int = 6,
              num_examples: int = 32, batch_size: int = 8, seed: int = 4321,
              progress: bool = False, generate_fn: Callable | None = None,
              kind: str | None = None) -> dict[str, Any]:
    """Exact match and per-digit accuracy per (length, depth), plus their grid means;
    with multi-value needles also per_value (the fraction of values right). `kind`: the
    run's first NIAH task (None), a mixture component's name or a kind (niah_spec); the
    grid says what it drew under "needles"."""
    train_len = int(cfg_get(config, "data.seq_len"))
    if not lengths:
        lengths = [train_len * int(m) for m in length_multiples]
    depths = [float(d) for d in np.linspace(0.0, 1.0, int(num_depths))]
    spec = None
    if generate_fn is None:
        spec = {k: v for k, v in niah_spec(dataset, kind).items() if k != "_dataset"}
    num_values = spec["num_values"] if spec else 1
    gen = generate_fn or (lambda n, d, k, s: niah_generate(dataset, n, d, k, s, kind))
    cells = []
    grid = [(int(n), d) for n in lengths for d in depths]
    it = grid
    if progress:
        from tqdm import tqdm
        it = tqdm(grid, desc=f"niah {kind}" if kind else "niah", unit="cell")
    for i, (n, d) in enumerate(it):
        ex = gen(n, d, num_examples, seed + i)
        exact, frac, per_value = [], [], []
        for b in _batched(ex, batch_size):
            e, f, v = niah_scores(stats_fn, b, num_values)
            exact.append(e)
            frac.append(f)
            per_value.append(v)
        exact, frac = np.concatenate(exact), np.concatenate(frac)
        cell = {"length": n, "depth": d, "exact": float(np.nanmean(exact)),
                "per_digit": float(np.nanmean(frac)),
                "examples": int(np.isfinite(exact).sum())}
        if num_values > 1:
            cell["per_value"] = float(np.nanmean(np.concatenate(per_value)))
        cells.append(cell)

    def mean(key):
        return float(np.mean([c[key] for c in cells])) if cells else float("nan")
    out = {"task": "niah", "train_length": train_len, "cells": cells,
           "exact": mean("exact"), "per_digit": mean("per_digit")}
    if num_values > 1:
        out["per_value"] = mean("per_value")
    if spec is not None:
        out["needles"] = spec
    if kind is not None:
        out["kind"] = kind
    return out


# ----------------------------------------------------------------------------- CLI
def run(workdir: str, task: str, *, seq_lens=(64, 128, 256, 512), num_examples: int = 0,
        batch_size: int = 32, length_multiples=(1, 2, 4, 8), num_depths: int = 6,
        step: int | str | None = None, kinds: Sequence[str] | None = None) -> dict:
    """kinds (NIAH): the tasks to grid, mixture component names or kinds (niah_spec);
    None: every NIAH component of the run. The first one's grid is the result's top
    level (as with one task); with more, each is also under result["kinds"][name], with
    its heatmap niah_heatmap_<name>.png."""
    if task not in ("mqar", "niah"):
        raise ValueError(f"--task={task!r}: choose mqar or niah")
    model, config, dataset, step = common.load_run(workdir, step)
    stats_fn = common.token_stats_fn(common.make_logits_fn(model),
                                     common.rows_packed(dataset))
    num_examples = num_examples or (256 if task == "mqar" else 32)
    if task == "mqar":
        result = mqar_grid(stats_fn, mqar_task(config, dataset),
                           default_mqar_settings(seq_lens), num_examples=num_examples,
                           batch_size=batch_size)
    else:
        from eval import plots
        names = list(kinds) if kinds else list(niah_components(dataset)) or [None]
        title = f"{os.path.basename(os.path.normpath(workdir))} (step {step})"
        grids = {}
        for i, name in enumerate(names):
            grid = niah_grid(stats_fn, config, dataset, length_multiples=length_multiples,
                             num_depths=num_depths, num_examples=num_examples,
                             batch_size=batch_size, progress=True,
                             kind=name if len(names) > 1 or kinds else None)
            png = "niah_heatmap.png" if i == 0 else f"niah_heatmap_{name}.png"
            grid["heatmap"] = plots.niah_heatmap(
                grid["cells"], os.path.join(workdir, png),
                title=title if i == 0 else f"{title}: {name}")
            grids[name] = grid
        result = dict(grids[names[0]])
        if len(names) > 1:
            result["kinds"] = grids
    result["step"] = int(step)
    common.write_json(os.path.join(workdir, f"recall_{task}.json"), result)
    return result


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@common.user_errors
def main(argv):
    del argv
    from absl import flags
    f = flags.FLAGS
    kinds = [k.strip() for k in f.kinds.split(",") if k.strip()] or None
    result = run(f.workdir, f.task, seq_lens=_ints(f.seq_lens), num_examples=f.num_examples,
                 batch_size=f.batch_size, length_multiples=_ints(f.length_multiples),
                 num_depths=f.num_depths, step=f.step, kinds=kinds)
    common.print_json(result)


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("workdir", None, "Run directory written by train.py.",
                        required=True)
    flags.DEFINE_enum("task", None, ["mqar", "niah"], "Which recall benchmark.",
                      required=True)
    flags.DEFINE_string("seq_lens", "64,128,256,512",
                        "MQAR sequence lengths (kv pairs 4..len/4).")
    flags.DEFINE_string("length_multiples", "1,2,4,8",
                        "NIAH lengths as multiples of data.seq_len.")
    flags.DEFINE_integer("num_depths", 6, "NIAH needle depths, evenly spaced over [0, 1].")
    flags.DEFINE_string("kinds", "", "NIAH tasks to grid, comma-separated: the run's "
                        "mixture component names (passkey, mk2, ...) or kinds (passkey, "
                        "multikey); empty: every NIAH component of the run.")
    flags.DEFINE_integer("num_examples", 0,
                         "Examples per MQAR setting / NIAH cell (0: 256 / 32).")
    flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
    flags.DEFINE_string("step", "latest", common.STEP_HELP)
    app.run(main)
