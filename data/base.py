"""The Dataset interface every source implements (docs/INTERFACES.md, section data/)."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from data.order import canonical_split

BATCH_KEYS = ("inputs", "targets", "mask", "segment_ids")


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """`cfg[a][b]` for the dotted key "a.b", in dicts, ConfigDicts and objects with
    attributes (a ModelConfig); `default` where a part is absent. None counts as unset:
    configs hold unset keys as None placeholders."""
    node = cfg
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        if node is None:
            return default
    return node


class Dataset:
    """Batches as a pure function of (seed, step, split).

    Subclasses set `tokenizer`, `seq_len`, `seed` and implement
    `_batch(step, batch_size, split)`, drawing randomness only from `order.step_rng`.
    """

    tokenizer: Any
    seq_len: int
    seed: int

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    @property
    def packed(self) -> bool:
        """Whether a row may hold several documents, so that the model must keep them
        apart by the batch's segment_ids. A static property of the source (the train step
        is traced with it): False where every row is one example (synthetic tasks), and
        then the model is given no segment ids at all."""
        return True

    @property
    def targets_per_row(self) -> int | None:
        """The most positions of one row whose mask is nonzero (the loss's targets), or
        None where any number may be. A static promise of the source, every split (the
        train and eval steps are traced with it and form logits only at those positions:
        training.step.loss_sums); None, the default, for text, where every token counts."""
        return None

    def batch(self, step: int, batch_size: int, split: str = "train") -> dict:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        return self._batch(int(step), int(batch_size), canonical_split(split))

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        raise NotImplementedError

    def batch_rows(self, step: int, batch_size: int, rows=None, split: str = "train") -> dict:
        """Rows `rows` (indices into the batch, in that order) of `batch(step, batch_size,
        split)`, equal to `batch(...)[rows]` field by field: what one process of several
        reads of a global batch (training/sharding.process_indices). None: every row.
        Sources that can read a row without the others (text, the token store) read only
        these; the others build the batch and keep the rows."""
        if rows is None:
            return self.batch(step, batch_size, split)
        rows = np.asarray(rows, np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= batch_size):
            raise ValueError(f"rows {rows.min()}..{rows.max()} outside a batch of {batch_size}")
        if rows.size == batch_size and np.array_equal(rows, np.arange(batch_size)):
            return self.batch(step, batch_size, split)
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        return self._batch_rows(int(step), int(batch_size), rows, canonical_split(split))

    def _batch_rows(self, step: int, batch_size: int, rows: np.ndarray, split: str) -> dict:
        return {k: v[rows] for k, v in self._batch(step, batch_size, split).items()}

    def eval_batches(self, batch_size: int, num_batches: int | None = 8) -> Iterator[dict]:
        """A fixed held-out set: batch i is `batch(i, batch_size, "val")`."""
        if num_batches is None:
            raise ValueError(f"{type(self).__name__} has no natural end; give num_batches")
        for i in range(int(num_batches)):
            yield self.batch(i, batch_size, "val")
