"""Packing token streams into fixed-length training rows.

Documents are tokenised and joined with an end-of-document id (EOD). A row is a
window of seq_len + 1 tokens of that stream: inputs are its first seq_len tokens,
targets the last seq_len (next-token prediction).

Segment ids number the documents inside a row 1, 2, ...: an EOD token *starts* the
next segment (it plays the beginning-of-sequence role for the next document), so the
last token of a document still predicts EOD inside its own segment (counted in the
loss), and no token ever attends across a document boundary.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def concat_documents(docs: Sequence[np.ndarray], eod_id: int | None, *,
                     eod_after_last: bool = True) -> np.ndarray:
    """One int32 stream: doc0 EOD doc1 EOD ... (the last EOD only if `eod_after_last`)."""
    parts = []
    for i, d in enumerate(docs):
        parts.append(np.asarray(d, dtype=np.int32))
        if eod_id is not None and (eod_after_last or i < len(docs) - 1):
            parts.append(np.array([eod_id], dtype=np.int32))
    if not parts:
        return np.zeros((0,), np.int32)
    return np.concatenate(parts)


def split_stream(stream: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """First (1 - val_fraction) of the tokens for training, the rest held out (nanoGPT)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
    cut = int(len(stream) * (1.0 - val_fraction))
    return stream[:cut], stream[cut:]


def segment_ids(inputs: np.ndarray, eod_id: int | None) -> np.ndarray:
    """(B, T) segment ids: 1 + number of EOD tokens at positions 1..t of the row."""
    inputs = np.asarray(inputs)
    if eod_id is None:
        return np.ones(inputs.shape, np.int32)
    is_eod = (inputs == eod_id).astype(np.int32)
    is_eod[..., 0] = 0  # an EOD opening the row just starts segment 1
    return (1 + np.cumsum(is_eod, axis=-1)).astype(np.int32)


def windows(stream: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs stream[s:s+T] and targets stream[s+1:s+T+1] for each start s."""
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size and (starts.min() < 0 or starts.max() + seq_len + 1 > len(stream)):
        raise ValueError("window out of range of the token stream")
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    rows = stream[idx]
    return rows[:, :-1].astype(np.int32), rows[:, 1:].astype(np.int32)


def num_full_rows(stream_len: int, seq_len: int) -> int:
    """Rows at stride seq_len (consecutive rows share one token, so every token but the
    first is a target exactly once)."""
    return max(0, (stream_len - 1) // seq_len)


def make_batch(inputs: np.ndarray, targets: np.ndarray, eod_id: int | None,
               mask: np.ndarray | None = None) -> dict:
    """The batch dict every dataset returns."""
    seg = segment_ids(inputs, eod_id)
    mask = np.ones(inputs.shape, np.float32) if mask is None else np.asarray(mask)
    return {"inputs": inputs.astype(np.int32), "targets": targets.astype(np.int32),
            "mask": mask.astype(np.float32), "segment_ids": seg.astype(np.int32)}


def sequential_rows(stream: np.ndarray, seq_len: int, eod_id: int | None) -> dict:
    """Every target of `stream` exactly once, in order: rows at stride seq_len, the last
    one padded (inputs/targets 0, mask 0, segment id 0 on the padding)."""
    n_targets = len(stream) - 1
    if n_targets <= 0:
        raise ValueError(f"held-out stream has {len(stream)} tokens; need at least 2")
    n_rows = -(-n_targets // seq_len)
    padded = np.zeros((n_rows * seq_len + 1,), np.int32)
    padded[:len(stream)] = stream
    starts = np.arange(n_rows) * seq_len
    inputs, targets = windows(padded, starts, seq_len)
    pos = starts[:, None] + np.arange(seq_len)[None, :]
    valid = pos < n_targets
    seg = np.where(valid, segment_ids(inputs, eod_id), 0)
    return {"inputs": np.where(valid, inputs, 0).astype(np.int32),
            "targets": np.where(valid, targets, 0).astype(np.int32),
            "mask": valid.astype(np.float32), "segment_ids": seg.astype(np.int32)}


def pad_rows(batch: dict, batch_size: int) -> dict:
    """Pad a batch dict with empty rows (everything 0) up to batch_size rows."""
    n = batch["inputs"].shape[0]
    if n >= batch_size:
        return batch
    return {k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)])
            for k, v in batch.items()}
