"""Language-model data from text: files, Hugging Face hub datasets, or TFDS.

Two ways to cut the tokenised stream into rows (`data.packing`):
- `random_windows` (default, nanoGPT): each row is a window of seq_len + 1 tokens at
  a uniformly random start, drawn by rng([seed, step]).
- `rows`: consecutive rows at stride seq_len, visited in a fresh permutation each
  epoch (the permutation of epoch e is drawn by rng([seed, e, 1])).

The held-out split is the last `val_fraction` of the token stream (nanoGPT's 90/10),
or a separate split of the source when `data.val_split` is set. `eval_batches` walks
it in order so every held-out token is scored exactly once.
"""
from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np

from data import packing, sources
from data import tokenizers as toks
from data.base import Dataset, cfg_get
from data.order import EpochPermutations, row_starts, step_rng

PACKINGS = ("random_windows", "rows")


def packing_of(cfg: Mapping) -> str:
    """data.packing (default "random_windows"), checked against PACKINGS."""
    packing = cfg_get(cfg, "packing", "random_windows")
    if packing not in PACKINGS:
        raise ValueError(f"data.packing must be one of {PACKINGS}, got {packing!r}")
    return packing


EOD = "<|eod|>"


def load_documents(cfg: Mapping, *, split: str | None = None) -> list[str]:
    source = cfg_get(cfg, "source", "files")
    if source == "files":
        files = cfg_get(cfg, "files")
        if split is not None:  # a separate held-out file set
            files = split
        return sources.load_files(files, cfg_get(cfg, "sample_by", "document"),
                                  cfg_get(cfg, "cache_dir"),
                                  cfg_get(cfg, "encoding_errors", "strict"))
    if source == "hf":
        return sources.load_hf(cfg_get(cfg, "name"), split=split or cfg_get(cfg, "split", "train"),
                               subset=cfg_get(cfg, "subset"),
                               text_field=cfg_get(cfg, "text_field", "text"),
                               max_documents=cfg_get(cfg, "max_documents",
                                                     sources.HF_MAX_DOCUMENTS))
    if source == "tfds":
        return sources.load_tfds(cfg_get(cfg, "name"), split=split or cfg_get(cfg, "split", "train"),
                                 text_field=cfg_get(cfg, "text_field", "text"),
                                 max_documents=cfg_get(cfg, "max_documents"),
                                 data_dir=cfg_get(cfg, "data_dir"))
    raise ValueError(f"not a text source: {source!r}")


def encode_documents(tokenizer, docs: list[str]) -> list[np.ndarray]:
    enc = getattr(tokenizer, "encode_array", None)
    if enc is None:
        return [np.asarray(tokenizer.encode(d), np.int32) for d in docs]
    return [enc(d) for d in docs]


class TextDataset(Dataset):
    def __init__(self, cfg: Mapping, *, seed: int, tokenizer=None):
        self.seed = int(seed)
        self.seq_len = int(cfg_get(cfg, "seq_len", 256))
        self.packing = packing_of(cfg)
        val_fraction = float(cfg_get(cfg, "val_fraction", 0.1))

        docs = load_documents(cfg)
        val_split = cfg_get(cfg, "val_split")
        val_docs = load_documents(cfg, split=val_split) if val_split else None

        # The char vocabulary and SentencePiece model are built from all the text of the
        # source (as nanoGPT does), so no held-out character is unknown.
        base = tokenizer if tokenizer is not None else toks.build(
            cfg_get(cfg, "tokenizer", "byte"), docs + (val_docs or []),
            tokenizer_dir=cfg_get(cfg, "tokenizer_dir"), vocab_size=cfg_get(cfg, "vocab_size"))
        base = base.base if isinstance(base, toks.WithSpecials) else base

        # An end-of-document id is needed whenever documents meet inside a row. A single
        # document cut into random windows needs none, so char-level tiny-Shakespeare
        # keeps nanoGPT's 65 symbols.
        rows = self.packing == "rows"
        use_eod = cfg_get(cfg, "eod")  # None: decide from the data
        if use_eod is None:
            use_eod = rows or len(docs) > 1 or (val_docs is not None and len(val_docs) > 1)
        self.tokenizer = toks.WithSpecials(base, [EOD] if use_eod else [])
        self.eod_id = self.tokenizer.id_of(EOD) if use_eod else None

        stream = packing.concat_documents(encode_documents(base, docs), self.eod_id,
                                          eod_after_last=rows)
        if val_docs is None:
            self.train_tokens, self.val_tokens = packing.split_stream(stream, val_fraction)
        else:
            self.train_tokens = stream
            self.val_tokens = packing.concat_documents(
                encode_documents(base, val_docs), self.eod_id, eod_after_last=rows)
        self.num_documents = len(docs)
        self._perms: dict[str, EpochPermutations] = {}  # packing=rows, by split
        self._check_length("train")

    def _check_length(self, split: str) -> None:
        n = len(self._stream(split))
        if n < self.seq_len + 1:
            name = "training" if split == "train" else "held-out"
            raise ValueError(
                f"the {name} split has {n} tokens, fewer than seq_len + 1 = "
                f"{self.seq_len + 1}; lower data.seq_len or give more text"
                + ("" if split == "train" else " (or raise data.val_fraction)"))

    def _stream(self, split: str) -> np.ndarray:
        return self.train_tokens if split == "train" else self.val_tokens

    @property
    def packed(self) -> bool:
        """Documents meet in a row only where an end-of-document id separates them."""
        return self.eod_id is not None

    def _starts(self, step: int, batch_size: int, split: str) -> np.ndarray:
        """Every row's start in the split's stream: the batch's one draw from
        rng([seed, step]) (or the epoch's permutation), whichever rows are read."""
        stream = self._stream(split)
        self._check_length(split)
        if self.packing == "random_windows":
            rng = step_rng(self.seed, step, split)
            return rng.integers(0, len(stream) - self.seq_len, size=batch_size)
        return row_starts(step, batch_size, self.seq_len, self._permutations(split))

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        return self._rows_at(self._starts(step, batch_size, split), split)

    def _batch_rows(self, step: int, batch_size: int, rows: np.ndarray, split: str) -> dict:
        return self._rows_at(self._starts(step, batch_size, split)[rows], split)

    def _rows_at(self, starts: np.ndarray, split: str) -> dict:
        inputs, targets = packing.windows(self._stream(split), starts, self.seq_len)
        return packing.make_batch(inputs, targets, self.eod_id)

    def _permutations(self, split: str) -> EpochPermutations:
        if split not in self._perms:
            n_rows = packing.num_full_rows(len(self._stream(split)), self.seq_len)
            self._perms[split] = EpochPermutations(self.seed, split, n_rows)
        return self._perms[split]

    def eval_batches(self, batch_size: int, num_batches: int | None = None) -> Iterator[dict]:
        """The held-out stream in order, every token scored once; the last batch is
        padded with rows whose mask is 0. `num_batches` caps how many are yielded."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if len(self.val_tokens) < 2:
            raise ValueError("no held-out tokens: data.val_fraction is 0 and no data.val_split")
        rows = packing.sequential_rows(self.val_tokens, self.seq_len, self.eod_id)
        n = rows["inputs"].shape[0]
        total = -(-n // batch_size)
        if num_batches is not None:
            total = min(total, int(num_batches))
        for b in range(total):
            chunk = {k: v[b * batch_size:(b + 1) * batch_size] for k, v in rows.items()}
            yield packing.pad_rows(chunk, batch_size)
