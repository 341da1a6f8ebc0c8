"""Recall of a trained run: MQAR by (sequence length, kv pairs), NIAH by (length, depth).

    python -m eval.recall --workdir=DIR --task=mqar \
        [--seq_lens=64,128,256,512 --num_examples=256]
    python -m eval.recall --workdir=DIR --task=niah \
        [--length_multiples=1,2,4,8 --num_depths=6]

Accuracy is teacher-forced: one forward pass per batch, then argmax(logits) == target
at the positions the mask marks (MQAR: the query positions; NIAH: the answer digits).
For NIAH, "exact" is the fraction of examples with every digit right (the same as
greedy decoding getting all digits, since greedy and teacher forcing agree until the
first wrong digit) and "per_digit" the fraction of digits right. Lengths beyond the
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
def find_niah(dataset):
    """The NIAH dataset inside a run's dataset (itself, or a component of a mixture)."""
    seen, todo = set(), [dataset]
    while todo:
        d = todo.pop(0)
        if id(d) in seen:
            continue
        seen.add(id(d))
        if hasattr(d, "num_digits") and hasattr(d, "base_vocab") and hasattr(d, "kind"):
            return d
        for attr in ("components", "datasets", "parts"):
            sub = getattr(d, attr, None)
            if isinstance(sub, Mapping):
                todo += list(sub.values())
            elif isinstance(sub, (list, tuple)):
                todo += [x[-1] if isinstance(x, tuple) else x for x in sub]
    raise ValueError("--task=niah needs a run trained with needles (data.source=niah, or a "
                     "mixture with a niah component); this run's dataset has none")


def niah_generate(dataset, length: int, depth: float, num_examples: int, seed: int,
                  kind: str | None = None) -> dict:
    """NIAH examples of one (length, depth) cell, drawn like the run's own NIAH data."""
    from data import niah

    d = find_niah(dataset)
    ex = niah.generate(np.random.default_rng(seed), num_examples, int(length), float(depth),
                       kind or d.kind, d.num_keys, d.filler_tokens, d.base_vocab,
                       d.filler_vocab, d.num_digits, d.key_vocab, getattr(d, "key_len", 1))
    offset = int(getattr(d, "vocab_offset", 0))
    return {"inputs": ex["inputs"] + offset, "targets": ex["targets"] + offset,
            "mask": ex["mask"]}


def niah_grid(stats_fn, config, dataset, *, lengths: Sequence[int] | None = None,
              length_multiples: Sequence[int] = (1, 2, 4, 8), num_depths: int = 6,
              num_examples: int = 32, batch_size: int = 8, seed: int = 4321,
              progress: bool = False, generate_fn: Callable | None = None,
              kind: str | None = None) -> dict[str, Any]:
    """Exact match and per-digit accuracy per (length, depth), plus their grid means."""
    train_len = int(cfg_get(config, "data.seq_len"))
    if not lengths:
        lengths = [train_len * int(m) for m in length_multiples]
    depths = [float(d) for d in np.linspace(0.0, 1.0, int(num_depths))]
    gen = generate_fn or (lambda n, d, k, s: niah_generate(dataset, n, d, k, s, kind))
    cells = []
    grid = [(int(n), d) for n in lengths for d in depths]
    it = grid
    if progress:
        from tqdm import tqdm
        it = tqdm(grid, desc="niah", unit="cell")
    for i, (n, d) in enumerate(it):
        ex = gen(n, d, num_examples, seed + i)
        exact, frac = [], []
        for b in _batched(ex, batch_size):
            e, f = example_scores(stats_fn, b)
            exact.append(e)
            frac.append(f)
        exact, frac = np.concatenate(exact), np.concatenate(frac)
        cells.append({"length": n, "depth": d, "exact": float(np.nanmean(exact)),
                      "per_digit": float(np.nanmean(frac)),
                      "examples": int(np.isfinite(exact).sum())})

    def mean(key):
        return float(np.mean([c[key] for c in cells])) if cells else float("nan")
    return {"task": "niah", "train_length": train_len, "cells": cells,
            "exact": mean("exact"), "per_digit": mean("per_digit")}


# ----------------------------------------------------------------------------- CLI
def run(workdir: str, task: str, *, seq_lens=(64, 128, 256, 512), num_examples: int = 0,
        batch_size: int = 32, length_multiples=(1, 2, 4, 8), num_depths: int = 6,
        step: int | str | None = None) -> dict:
    if task not in ("mqar", "niah"):
        raise ValueError(f"--task={task!r}: choose mqar or niah")
    model, config, dataset, step = common.load_run(workdir, step)
    stats_fn = common.token_stats_fn(common.make_logits_fn(model))
    num_examples = num_examples or (256 if task == "mqar" else 32)
    if task == "mqar":
        result = mqar_grid(stats_fn, mqar_task(config, dataset),
                           default_mqar_settings(seq_lens), num_examples=num_examples,
                           batch_size=batch_size)
    else:
        result = niah_grid(stats_fn, config, dataset, length_multiples=length_multiples,
                           num_depths=num_depths, num_examples=num_examples,
                           batch_size=batch_size, progress=True)
        from eval import plots
        result["heatmap"] = plots.niah_heatmap(
            result["cells"], os.path.join(workdir, "niah_heatmap.png"),
            title=f"{os.path.basename(os.path.normpath(workdir))} (step {step})")
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
    result = run(f.workdir, f.task, seq_lens=_ints(f.seq_lens), num_examples=f.num_examples,
                 batch_size=f.batch_size, length_multiples=_ints(f.length_multiples),
                 num_depths=f.num_depths, step=f.step)
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
    flags.DEFINE_integer("num_examples", 0,
                         "Examples per MQAR setting / NIAH cell (0: 256 / 32).")
    flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
    flags.DEFINE_string("step", "latest", common.STEP_HELP)
    app.run(main)
