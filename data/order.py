"""Deterministic randomness: every batch is a pure function of (seed, step, split).

No iterator state is kept anywhere, so resuming at step N replays exactly the batches
an uninterrupted run would have seen (Levanter's rule).
"""
from __future__ import annotations

import threading

import numpy as np

# A second, disjoint stream for held-out data: SeedSequence entropy of a different
# length and value never collides with the training stream [seed, step].
EVAL_STREAM = 0x5EED_E7A1
SPLITS = ("train", "val")
_ALIASES = {"train": "train", "val": "val", "valid": "val", "validation": "val",
            "eval": "val", "test": "val"}


def canonical_split(split: str) -> str:
    try:
        return _ALIASES[split]
    except KeyError:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'val'") from None


# Note: SeedSequence ignores trailing zeros ([s, t, 0] == [s, t]), so a stream tag
# must never be 0.


def step_rng(seed: int, step: int, split: str = "train", *extra: int) -> np.random.Generator:
    """The generator for batch `step` of `split`: rng([seed, step]) for training."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    key = [int(seed), int(step)]
    if canonical_split(split) == "val":
        key.append(EVAL_STREAM)
    return np.random.default_rng(key + [int(e) for e in extra])


def derive_seed(seed: int, *path: int) -> int:
    """A child seed for a sub-dataset (e.g. a mixture component)."""
    return int(np.random.SeedSequence([int(seed), *map(int, path)]).generate_state(1)[0])


class EpochPermutations:
    """The permutation of rows for each epoch of `packing=rows`, drawn by
    rng([seed, e, 1]) (training; the held-out tag added for "val"), the last two kept:
    every batch of an epoch reuses its permutation instead of drawing n_rows numbers
    again (a cache of a pure function, so the batches do not depend on it)."""

    def __init__(self, seed: int, split: str, n_rows: int, keep: int = 2):
        self.seed, self.split, self.n_rows, self.keep = int(seed), split, int(n_rows), keep
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # a prefetch thread and the caller may both ask

    def __call__(self, epoch: int) -> np.ndarray:
        with self._lock:
            perm = self._cache.get(epoch)
            if perm is None:
                perm = step_rng(self.seed, epoch, self.split, 1).permutation(self.n_rows)
                if len(self._cache) >= self.keep:
                    self._cache.pop(min(self._cache))
                self._cache[epoch] = perm
            return perm


def row_starts(step: int, batch_size: int, seq_len: int,
               permutations: EpochPermutations) -> np.ndarray:
    """`packing=rows`: the starts of batch `step`'s rows, rows at stride seq_len visited
    in a fresh permutation each epoch, so the order is a pure function of (seed, step)
    however many batches an epoch holds."""
    n_rows = permutations.n_rows
    flat = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epoch, pos = flat // n_rows, flat % n_rows
    rows = np.empty_like(flat)
    for e in np.unique(epoch):
        rows[epoch == e] = permutations(int(e))[pos[epoch == e]]
    return rows * seq_len
