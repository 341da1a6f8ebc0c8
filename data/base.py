"""The Dataset interface every source implements (docs/INTERFACES.md, section data/)."""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from data.order import canonical_split

BATCH_KEYS = ("inputs", "targets", "mask", "segment_ids")


def cfg_get(cfg: Mapping, key: str, default: Any = None) -> Any:
    """`cfg.get(key, default)` for dicts and ConfigDicts; None counts as unset."""
    value = cfg.get(key, default) if hasattr(cfg, "get") else default
    return default if value is None else value


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

    def batch(self, step: int, batch_size: int, split: str = "train") -> dict:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        return self._batch(int(step), int(batch_size), canonical_split(split))

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        raise NotImplementedError

    def eval_batches(self, batch_size: int, num_batches: int | None = 8) -> Iterator[dict]:
        """A fixed held-out set: batch i is `batch(i, batch_size, "val")`."""
        if num_batches is None:
            raise ValueError(f"{type(self).__name__} has no natural end; give num_batches")
        for i in range(int(num_batches)):
            yield self.batch(i, batch_size, "val")
