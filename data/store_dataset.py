"""`data.source=store`: training batches read from a token store (data/store.py).

The concatenation of the store's shards is the packed stream the in-memory text path
builds (each document followed by the end-of-document id), so the batches are the
in-memory path's, row for row, for the same corpus, seed and step: `random_windows`
(the stream without its final EOD, as data.text builds it) and `rows` both draw their
starts exactly as data.text does, and the held-out split is the same last
`val_fraction` of the stream, walked in order.

Reading: rows are read with `os.preadv` straight into the batch array, at most two
reads a row (a row may cross one shard boundary). Why not keep the shards mapped: the
pages of a memory map a run touches count in its resident memory (RssFile) and random
windows touch all of a store, so a long run over a 4 GB store would show 4 GB resident;
`pread` leaves them in the kernel's page cache, which it reclaims, and a 2,049-token
row costs one system call. The files are opened with `np.load(mmap_mode="r")` once, to
check their header, dtype and length against the manifest and find the data offset.
Why not grain: it is not installed on the GPU machine, and what it would give us
(index sampling, worker threads, prefetch) is here two slices and one thread
(data/prefetch.py), with the order a pure function of (seed, step).
"""
from __future__ import annotations

import os
from typing import Iterator, Mapping

import numpy as np

from data import packing
from data import store as st
from data import tokenizers as toks
from data.base import Dataset, cfg_get
from data.order import EpochPermutations, row_starts, step_rng
from data.text import EOD, packing_of


class ShardedTokens:
    """The shards' tokens as one stream of `length` ids (a prefix of their
    concatenation), read by position with pread."""

    def __init__(self, directory, manifest: dict, *, verify: bool):
        dtype = np.dtype(manifest["dtype"])
        self.dtype = dtype
        self._fds, self._data_offsets, sizes = [], [], []
        for rec in manifest["shards"]:
            tokens, _ = st.open_shard(directory, rec, dtype, verify=verify)
            self._data_offsets.append(int(tokens.offset))  # the .npy header's length
            sizes.append(len(tokens))
            del tokens  # the map is closed; reads go through the file descriptor
            self._fds.append(os.open(directory / rec["tokens_file"], os.O_RDONLY))
        self.starts = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=self.starts[1:])
        self.length = int(self.starts[-1])

    def __len__(self) -> int:
        return self.length

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: os may be gone
            pass

    def read_into(self, out: np.ndarray, start: int) -> None:
        """out[:] = stream[start:start + len(out)] (out: 1-D, C-contiguous, self.dtype)."""
        end = start + len(out)
        if start < 0 or end > self.length:
            raise ValueError(f"read [{start}, {end}) outside the stream of {self.length}")
        k = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos = 0
        while pos < len(out):
            local = start + pos - int(self.starts[k])
            n = min(len(out) - pos, int(self.starts[k + 1]) - (start + pos))
            view = memoryview(out[pos:pos + n]).cast("B")
            got = os.preadv(self._fds[k], [view], self._data_offsets[k] + local * self.dtype.itemsize)
            if got != view.nbytes:
                raise st.StoreError(f"token store shard {k} ended early (read {got} of "
                                    f"{view.nbytes} bytes): it changed after it was checked")
            pos, k = pos + n, k + 1

    def rows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """(len(starts), width) int32: stream[s:s + width] for each start s."""
        buf = np.empty((len(starts), width), self.dtype)
        for i, s in enumerate(starts):
            self.read_into(buf[i], int(s))
        return buf.astype(np.int32)


class StoreDataset(Dataset):
    """Packed rows of a token store; the Dataset interface of data/base.py."""

    def __init__(self, cfg: Mapping, *, seed: int, tokenizer=None):
        self.seed = int(seed)
        self.seq_len = int(cfg_get(cfg, "seq_len", 256))
        self.packing = packing_of(cfg)
        path = cfg_get(cfg, "store")
        if not path:
            raise ValueError("data.source=store needs data.store=PATH, a directory written "
                             "by python -m data.prepare --files=... --out=PATH")
        directory, manifest = st.load_manifest(path)
        self.manifest = manifest
        base = st.load_tokenizer(directory, manifest)
        _check_tokenizer(directory, manifest, cfg, tokenizer)
        self.tokenizer = toks.WithSpecials(base, [EOD])
        self.eod_id = self.tokenizer.id_of(EOD)
        if self.eod_id != manifest["eod_id"]:
            raise st.StoreError(f"token store {directory}: manifest eod_id "
                                f"{manifest['eod_id']} is not the id after the tokenizer's "
                                f"vocabulary ({self.eod_id}); prepare the store again")
        self.num_documents = int(manifest["documents"])
        self.tokens = ShardedTokens(directory, manifest,
                                    verify=bool(cfg_get(cfg, "verify_store", True)))
        # data.text's stream ends without an EOD for random windows, with one for rows.
        n = len(self.tokens) - (0 if self.packing == "rows" else 1)
        val_fraction = float(cfg_get(cfg, "val_fraction", 0.1))
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
        self._cut = int(n * (1.0 - val_fraction))  # packing.split_stream's cut
        self._bounds = {"train": (0, self._cut), "val": (self._cut, n)}
        self._permutations = {split: EpochPermutations(
            self.seed, split, packing.num_full_rows(b - a, self.seq_len))
            for split, (a, b) in self._bounds.items()}
        self._check_length("train")

    def _len(self, split: str) -> int:
        a, b = self._bounds[split]
        return b - a

    def _check_length(self, split: str) -> None:
        n = self._len(split)
        if n < self.seq_len + 1:
            name = "training" if split == "train" else "held-out"
            raise ValueError(f"the {name} split of the token store has {n} tokens, fewer "
                             f"than seq_len + 1 = {self.seq_len + 1}; lower data.seq_len "
                             "or prepare more text")

    def _starts(self, step: int, batch_size: int, split: str) -> np.ndarray:
        """Every row's start in the split: the batch's one draw from rng([seed, step])
        (or the epoch's permutation), whichever rows are then read."""
        self._check_length(split)
        n = self._len(split)
        if self.packing == "random_windows":
            return step_rng(self.seed, step, split).integers(0, n - self.seq_len,
                                                             size=batch_size)
        return row_starts(step, batch_size, self.seq_len, self._permutations[split])

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        return self._read(self._starts(step, batch_size, split), split)

    def _batch_rows(self, step: int, batch_size: int, rows: np.ndarray, split: str) -> dict:
        """Only `rows` are read from the shards: a process's share of a global batch."""
        return self._read(self._starts(step, batch_size, split)[rows], split)

    def _read(self, starts: np.ndarray, split: str) -> dict:
        rows = self.tokens.rows(np.asarray(starts) + self._bounds[split][0], self.seq_len + 1)
        return packing.make_batch(rows[:, :-1], rows[:, 1:], self.eod_id)

    def eval_batches(self, batch_size: int, num_batches: int | None = None) -> Iterator[dict]:
        """The held-out stream in order, every token scored once (data.text's rows: the
        last batch padded with mask-0 rows); only the batches asked for are read."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        a, b = self._bounds["val"]
        if b - a < 2:
            raise ValueError("no held-out tokens in the token store: data.val_fraction is 0")
        n_rows = -(-(b - a - 1) // self.seq_len)
        total = -(-n_rows // batch_size)
        if num_batches is not None:
            total = min(total, int(num_batches))
        span = batch_size * self.seq_len
        for i in range(total):
            lo = a + i * span
            chunk = np.empty(min(span + 1, b - lo), self.tokens.dtype)
            self.tokens.read_into(chunk, lo)
            rows = packing.sequential_rows(chunk.astype(np.int32), self.seq_len, self.eod_id)
            yield packing.pad_rows(rows, batch_size)


def _check_tokenizer(directory, manifest: dict, cfg: Mapping, given) -> None:
    """The config (or a mixture's shared tokenizer) must ask for the store's tokenizer:
    ids from another tokenizer would train silently on garbage."""
    have = manifest["tokenizer"]
    if given is not None:
        base = given.base if isinstance(given, toks.WithSpecials) else given
        ident = st.tokenizer_identity(base)
        if ident != have:
            raise st.StoreError(f"token store {directory} was made with tokenizer "
                                f"{have['name']!r} (vocab {have['vocab_size']}), not the "
                                f"{ident['name']!r} (vocab {ident['vocab_size']}) the other "
                                "data components share; prepare it with that tokenizer")
        return
    want = cfg_get(cfg, "tokenizer", "byte")
    if want != have["name"]:
        raise st.StoreError(f"token store {directory} was made with tokenizer "
                            f"{have['name']!r}, but the config asks for data.tokenizer="
                            f"{want!r}: set --config.data.tokenizer={have['name']} or "
                            f"prepare the store with --tokenizer={want}")
    vocab = cfg_get(cfg, "vocab_size")
    if want == "sentencepiece" and vocab and int(vocab) != have["vocab_size"]:
        raise st.StoreError(f"token store {directory} has a SentencePiece vocabulary of "
                            f"{have['vocab_size']}, but the config asks for data.vocab_size="
                            f"{vocab}; set it to {have['vocab_size']} or prepare again")
