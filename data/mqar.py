"""Multi-query associative recall (MQAR), generated as Zoology does.

Layout of one example (HazyResearch/zoology `zoology/data/multiquery_ar.py`), with
V = vocab_size, n = num_kv_pairs, C = 2n the context length:

    inputs:  k1 v1 k2 v2 ... kn vn | 0 0 k3 0 0 0 k1 0 ...   (seq_len tokens)
    targets: next tokens, except at a query key, whose target is that key's value
    mask:    1 at the n query positions, 0 elsewhere (Zoology's -100 labels)

Keys are drawn without replacement from [1, V/2), values from [V/2, V). Each key is
queried exactly once after the context, at position C + 2 g with the gap index g in
[0, S), S = (seq_len - C) / 2, drawn without replacement with p(g) ~ (g + 1)^(a - 1)
(a power law: recent keys are queried more often). As in Zoology the value is not
written into the inputs after its query key: only the target carries it. Filler is
token 0 (Zoology's `random_non_queries=True` replaces it with uniform random tokens).

Passing an `np.random.RandomState(seed)` reproduces Zoology's draws call for call;
an `np.random.Generator` (what datasets use) gives the same distribution.

Zoology's mixture of settings (the Based-era configs, zoology/experiments/paper_configs/
arxiv24_based_figure2/configs.py: 100k examples of (64, 4) and 20k each of (128, 8),
(256, 16), (256, 32), (256, 64)) is `num_kv_pairs=[[64, 4, 5], [128, 8, 1], ...]`: each
row draws a setting [seq_len, kv, weight] with probability proportional to its weight,
and an example shorter than data.seq_len is followed by masked filler (inputs, targets 0,
mask 0), which a causal model cannot see from the example's positions. Each query's
mask is 1/kv, so that every example weighs the same in the loss and in the eval
accuracy whatever its kv: Zoology's loss is a mean over the queries of batches that
each hold one setting, i.e. every example counts equally (its batches are taken in a
fixed order, all of one setting before the next, where ours draw a setting per row).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from data import packing
from data.base import Dataset, cfg_get
from data.order import step_rng
from data.tokenizers import IntegerTokenizer


def gap_probabilities(space: int, power_a: float = 0.01) -> np.ndarray:
    """p(g) for g = 0..space-1, proportional to (g + 1)^(a - 1), as Zoology computes it."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def _as_rng(rng_or_seed):
    if isinstance(rng_or_seed, (np.random.Generator, np.random.RandomState)):
        return rng_or_seed
    return np.random.default_rng(rng_or_seed)


def check_shape(seq_len: int, num_kv_pairs: int, vocab_size: int,
                vocab_key: str = "vocab_size") -> None:
    """ValueError unless the task fits; vocab_key: the config key vocab_size came from
    (mqar_vocab_size when set), which the message names."""
    if seq_len % 2:
        raise ValueError(f"MQAR seq_len must be even (key/query slots are pairs), got {seq_len}")
    if num_kv_pairs < 1:
        raise ValueError(f"MQAR num_kv_pairs must be >= 1, got {num_kv_pairs}")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(f"MQAR needs seq_len >= 4 * num_kv_pairs (context plus one query "
                         f"slot per key); got seq_len={seq_len}, num_kv_pairs={num_kv_pairs}")
    if vocab_size <= seq_len:
        raise ValueError(f"MQAR {vocab_key} ({vocab_size}) must exceed seq_len ({seq_len}), as in Zoology")
    if num_kv_pairs > vocab_size // 2 - 1:
        raise ValueError(f"MQAR {vocab_key} {vocab_size} has only {vocab_size // 2 - 1} keys "
                         f"for num_kv_pairs={num_kv_pairs}")


def generate(rng_or_seed, num_examples: int, seq_len: int, num_kv_pairs: int,
             vocab_size: int = 8192, power_a: float = 0.01,
             random_non_queries: bool = False) -> dict:
    """MQAR examples: dict(inputs (N,T) int32, targets (N,T) int32, mask (N,T) float32)."""
    check_shape(seq_len, num_kv_pairs, vocab_size)
    rng = _as_rng(rng_or_seed)
    n, N = num_kv_pairs, num_examples
    context = 2 * n
    half = vocab_size // 2
    space = (seq_len - context) // 2
    p = gap_probabilities(space, power_a)
    if isinstance(rng, np.random.RandomState):
        # Zoology's draws call for call: all keys, then all values, then all gaps, one
        # example at a time.
        draw = lambda choices, **kw: (
            np.stack([rng.choice(choices, size=n, replace=False, **kw) for _ in range(N)])
            if N else np.zeros((0, n), np.int64))
        keys = draw(np.arange(1, half))
        values = draw(np.arange(half, vocab_size))
        gaps = draw(np.arange(space), p=p)
    else:
        # The same distribution, every example at once (a batch of 128 x (256, 16) in
        # ~1 ms instead of ~15, which held training steps back on the host).
        keys = 1 + distinct_uniform(rng, N, half - 1, n)
        values = half + distinct_uniform(rng, N, vocab_size - half, n)
        gaps = distinct_weighted(rng, N, p, n)

    # seq_len + 1 tokens, so inputs and next-token targets are both seq_len long.
    seq = np.zeros((N, seq_len + 1), np.int64)
    seq[:, 0:context:2] = keys
    seq[:, 1:context:2] = values
    query_pos = context + 2 * gaps
    np.put_along_axis(seq, query_pos, keys, axis=1)
    if random_non_queries:
        filler = seq == 0
        seq[filler] = rng.integers(vocab_size, size=int(filler.sum()))
    inputs = seq[:, :-1]
    targets = seq[:, 1:].copy()
    np.put_along_axis(targets, query_pos, values, axis=1)
    mask = np.zeros((N, seq_len), np.float32)
    np.put_along_axis(mask, query_pos, 1.0, axis=1)
    return {"inputs": inputs.astype(np.int32), "targets": targets.astype(np.int32),
            "mask": mask}


def distinct_uniform(rng: np.random.Generator, rows: int, population: int,
                     size: int) -> np.ndarray:
    """(rows, size) int64: each row `size` distinct draws from range(population) in
    draw order, uniform over ordered tuples (as rng.choice(population, size,
    replace=False) per row). Rows with a repeat are drawn again whole, which keeps the
    accepted rows uniform; where a repeat is likely (acceptance < 1/2) each row is
    instead the first `size` of a random permutation."""
    if size > population:
        raise ValueError(f"cannot draw {size} distinct values from {population}")
    accept = np.prod(1.0 - np.arange(size) / population)
    if accept < 0.5:
        return np.argsort(rng.random((rows, population)), axis=1)[:, :size]
    out = rng.integers(population, size=(rows, size))
    redo = np.arange(rows)
    while redo.size:
        ordered = np.sort(out[redo], axis=1)
        redo = redo[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)]
        out[redo] = rng.integers(population, size=(redo.size, size))
    return out


def distinct_weighted(rng: np.random.Generator, rows: int, p: np.ndarray,
                      size: int) -> np.ndarray:
    """(rows, size) int64: each row `size` distinct indices of p drawn one after another
    with probability proportional to p among those not yet drawn (as rng.choice(len(p),
    size, replace=False, p=p) per row), by Gumbel top-k: the indices of the `size`
    largest log p + Gumbel noise, largest first, follow exactly that sequential law
    (the Plackett-Luce model)."""
    if size > np.count_nonzero(p):
        raise ValueError(f"cannot draw {size} distinct indices from {np.count_nonzero(p)} "
                         f"with nonzero probability")
    with np.errstate(divide="ignore"):
        scores = np.log(p)[None, :] + rng.gumbel(size=(rows, len(p)))
    top = np.argpartition(-scores, size - 1, axis=1)[:, :size]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


def parse_settings(kv, seq_len: int) -> list[tuple[int, int, float]] | None:
    """num_kv_pairs as Zoology's mixture of settings, [[seq_len, kv(, weight)], ...] ->
    [(seq_len, kv, weight)] (weight 1 when left out); None for an int or a list of ints
    (every row at data.seq_len). ValueError for a setting longer than data.seq_len, a
    weight that is not a positive number, or a mix of both forms."""
    if not (isinstance(kv, (list, tuple))
            and any(isinstance(k, (list, tuple)) for k in kv)):
        return None
    out = []
    for k in kv:
        if not (isinstance(k, (list, tuple)) and len(k) in (2, 3)):
            raise ValueError(f"MQAR num_kv_pairs={kv!r}: a list of settings takes "
                             f"[seq_len, kv] or [seq_len, kv, weight] entries only; {k!r} "
                             "is neither")
        t, n = int(k[0]), int(k[1])
        w = float(k[2]) if len(k) == 3 else 1.0
        if t > seq_len:
            raise ValueError(f"MQAR setting {list(k)}: its seq_len {t} exceeds "
                             f"data.seq_len {seq_len}, the row length it is padded to")
        if not (np.isfinite(w) and w > 0):
            raise ValueError(f"MQAR setting {list(k)}: weight {w} must be a positive "
                             "number")
        out.append((t, n, w))
    return out


class MQARDataset(Dataset):
    """Fresh MQAR examples every step, from rng([seed, step]); held-out set from a
    separate stream. Given `tokenizer` (the vocabulary so far, in a mixture), MQAR's
    ids are shifted to follow it."""

    def __init__(self, cfg: Mapping, *, seed: int, tokenizer=None):
        self.seed = int(seed)
        self.seq_len = int(cfg_get(cfg, "seq_len", 64))
        kv = cfg_get(cfg, "num_kv_pairs", 4)
        # Zoology's mixture of settings: each row draws a (seq_len, kv), padded
        self.settings = parse_settings(kv, self.seq_len)
        if self.settings is not None:
            kv = [n for _, n, _ in self.settings]
        # a list trains on several recall loads at once: each row draws its count
        self.kv_choices = [int(k) for k in kv] if isinstance(kv, (list, tuple)) else [int(kv)]
        self.num_kv_pairs = self.kv_choices[0] if len(self.kv_choices) == 1 else list(self.kv_choices)
        self.task_vocab = int(cfg_get(cfg, "mqar_vocab_size", cfg_get(cfg, "vocab_size", 8192)))
        self.power_a = float(cfg_get(cfg, "power_a", 0.01))
        self.random_non_queries = bool(cfg_get(cfg, "random_non_queries", False))
        vocab_key = "mqar_vocab_size" if cfg_get(cfg, "mqar_vocab_size") else "vocab_size"
        if self.settings is not None:
            for t, k, _ in self.settings:
                check_shape(t, k, self.task_vocab, vocab_key)
        else:
            for k in self.kv_choices:
                check_shape(self.seq_len, k, self.task_vocab, vocab_key)
        if tokenizer is None:
            self.vocab_offset = 0
            self.tokenizer = IntegerTokenizer(self.task_vocab)
        else:
            self.vocab_offset = tokenizer.vocab_size
            # each MQAR component of a mixture gets its own id range and names
            prefix, k = "mqar", 1
            while tokenizer.has(f"<{prefix}0>"):
                prefix, k = f"mqar{k}_", k + 1
            self.tokenizer = tokenizer.extend([f"<{prefix}{i}>" for i in range(self.task_vocab)])

    @property
    def packed(self) -> bool:
        """Every row is one example."""
        return False

    @property
    def targets_per_row(self) -> int:
        """A row's queries: at most the largest kv of its settings."""
        return max(self.kv_choices)

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        rng = step_rng(self.seed, step, split)
        if self.settings is not None:
            out = self._settings_rows(rng, batch_size)
        elif len(self.kv_choices) == 1:
            out = generate(rng, batch_size, self.seq_len, self.kv_choices[0],
                           self.task_vocab, self.power_a, self.random_non_queries)
        else:
            counts = rng.choice(self.kv_choices, size=batch_size)
            out = {"inputs": np.zeros((batch_size, self.seq_len), np.int32),
                   "targets": np.zeros((batch_size, self.seq_len), np.int32),
                   "mask": np.zeros((batch_size, self.seq_len), np.float32)}
            for k in sorted(set(counts.tolist())):
                rows = np.nonzero(counts == k)[0]
                part = generate(rng, len(rows), self.seq_len, k, self.task_vocab,
                                self.power_a, self.random_non_queries)
                for key in out:
                    out[key][rows] = part[key]
        inputs = out["inputs"] + self.vocab_offset
        targets = out["targets"] + self.vocab_offset
        return packing.make_batch(inputs, targets, None, out["mask"])

    def _settings_rows(self, rng, batch_size: int) -> dict:
        """Rows of a mixture of settings: row r draws setting i with p ~ weight_i; the
        rows of one setting are generated together (at its own seq_len, then padded with
        masked 0s), each query's mask 1/kv."""
        weights = np.array([w for _, _, w in self.settings], np.float64)
        which = rng.choice(len(self.settings), size=batch_size, p=weights / weights.sum())
        out = {"inputs": np.zeros((batch_size, self.seq_len), np.int32),
               "targets": np.zeros((batch_size, self.seq_len), np.int32),
               "mask": np.zeros((batch_size, self.seq_len), np.float32)}
        for i in sorted(set(which.tolist())):
            rows = np.nonzero(which == i)[0]
            t, k, _ = self.settings[i]
            part = generate(rng, len(rows), t, k, self.task_vocab, self.power_a,
                            self.random_non_queries)
            out["inputs"][rows, :t] = part["inputs"]
            out["targets"][rows, :t] = part["targets"]
            out["mask"][rows, :t] = part["mask"] / np.float32(k)
        return out
