"""Prefetch: the next training batches are read on a background thread.

A batch is a pure function of (seed, step, split), so prefetching changes no batch:
after `batch(s)` is asked for, batches s+1 .. s+depth are computed ahead on one worker
thread (a bounded set of pending results, never more than `depth`), and a later
`batch(s+1)` returns the ready result. A request for any other step (a resumed run, a
jump) is computed directly and the window moves there, so the position is still only
the step and nothing about the loader needs saving in a checkpoint. One thread is
enough: the store's reads (os.preadv) and numpy's copies release the GIL, and a
bounded window keeps memory at `depth` batches.
"""
from __future__ import annotations

import concurrent.futures
import threading

import numpy as np

from data.base import Dataset
from data.order import canonical_split


class Prefetched(Dataset):
    """`inner`'s batches, the next `depth` training batches computed ahead."""

    def __init__(self, inner: Dataset, depth: int = 2):
        if depth <= 0:
            raise ValueError(f"data.prefetch must be positive to prefetch, got {depth}")
        self.inner, self.depth = inner, int(depth)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefetch")
        self._pending: dict[tuple, concurrent.futures.Future] = {}
        self._lock = threading.Lock()  # batch() may be called from several threads

    def __getattr__(self, name):  # tokenizer, seq_len, seed, eod_id, manifest, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def packed(self) -> bool:
        return self.inner.packed

    @property
    def targets_per_row(self) -> int | None:
        return self.inner.targets_per_row

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        return self._get(step, batch_size, None, split)

    def batch_rows(self, step: int, batch_size: int, rows=None, split: str = "train") -> dict:
        """As Dataset.batch_rows; a process's share of the next batches is read ahead."""
        if rows is not None:
            rows = tuple(int(r) for r in np.asarray(rows).reshape(-1))
            if rows == tuple(range(batch_size)):
                rows = None
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        return self._get(int(step), int(batch_size), rows, canonical_split(split))

    def _read(self, step: int, batch_size: int, rows, split: str) -> dict:
        if rows is None:
            return self.inner.batch(step, batch_size, split)
        return self.inner.batch_rows(step, batch_size, np.asarray(rows, np.int64), split)

    def _get(self, step: int, batch_size: int, rows, split: str) -> dict:
        if split != "train":  # held-out batches are read once each: nothing to gain
            return self._read(step, batch_size, rows, split)
        shape = (batch_size, rows)
        with self._lock:
            fut = self._pending.pop((step, shape), None)
            # Drop what this request passed by (a jump), keep the window ahead of it.
            for key in [k for k in self._pending if not step < k[0] <= step + self.depth
                        or k[1] != shape]:
                self._pending.pop(key).cancel()
            for s in range(step + 1, step + self.depth + 1):
                if (s, shape) not in self._pending:
                    self._pending[(s, shape)] = self._pool.submit(
                        self._read, s, batch_size, rows, "train")
        return fut.result() if fut is not None else self._read(step, batch_size, rows, split)

    def eval_batches(self, *args, **kwargs):  # the inner dataset's own defaults
        return self.inner.eval_batches(*args, **kwargs)

    def close(self) -> None:
        with self._lock:
            for f in self._pending.values():
                f.cancel()
            self._pending.clear()
        self._pool.shutdown(wait=True)
