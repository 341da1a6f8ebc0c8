"""Needle in a haystack: passkey retrieval (Landmark Attention / RULER S-NIAH-1) and
multi-key retrieval (RULER MK-NIAH), as token sequences for models trained from scratch.

Each example is seq_len + 1 tokens (inputs are the first seq_len, targets the last):

    passkey:   haystack ... [NEEDLE] d1..d5 ... haystack [Q] d1 d2 d3 d4 d5
    multikey:  ... [NEEDLE] K2 e1..e5 ... [NEEDLE] K7 d1..d5 ... [Q] K7 d1 d2 d3 d4 d5

The haystack is filler text (windows of a given token stream) or random filler ids.
The queried needle starts at position round(depth * (H - L)) of the H-token haystack
(L the needle length), so depth 0 puts it first and depth 1 flush against the query.
Multi-key distractor needles (other keys, other digits) sit at random places around it.
The loss mask is 1 exactly where the targets are the answer digits.

Special ids come after `base_vocab` (the text tokenizer's vocabulary; absolute ids,
also inside a mixture): [NEEDLE], [Q], the digits 0-9, then `key_vocab` key ids; see
`special_names`. Two NIAH components of one mixture share these ids.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from data import packing
from data import tokenizers as toks
from data.base import Dataset, cfg_get
from data.order import step_rng

KINDS = ("passkey", "multikey")
NEEDLE, QUERY = "[NEEDLE]", "[Q]"


def special_names(key_vocab: int) -> list[str]:
    """Names of the ids NIAH reserves, in order, starting at base_vocab."""
    return [NEEDLE, QUERY] + [f"<{d}>" for d in range(10)] + [f"[K{k}]" for k in range(key_vocab)]


def num_specials(key_vocab: int) -> int:
    return 12 + key_vocab


def _as_rng(rng_or_seed):
    if isinstance(rng_or_seed, np.random.Generator):
        return rng_or_seed
    return np.random.default_rng(rng_or_seed)


def layout(seq_len: int, kind: str, num_keys: int, num_digits: int, key_len: int):
    """(haystack length, needle length, number of needles) for one example."""
    if kind not in KINDS:
        raise ValueError(f"NIAH kind must be one of {KINDS}, got {kind!r}")
    key = key_len if kind == "multikey" else 0
    needle_len = 1 + key + num_digits
    n_needles = num_keys if kind == "multikey" else 1
    hay = seq_len + 1 - (1 + key + num_digits)  # [Q] (key) digits end the sequence
    # at least one needle's worth of filler, so the queried needle can go at any depth
    if hay < (n_needles + 1) * needle_len:
        raise ValueError(f"NIAH seq_len={seq_len} is too short for {n_needles} needle(s) of "
                         f"{needle_len} tokens, as much filler, and the query; raise seq_len")
    return hay, needle_len, n_needles


def _filler(rng, length: int, filler_tokens, filler_vocab: int) -> np.ndarray:
    if filler_tokens is None:
        return rng.integers(0, filler_vocab, size=length)
    stream = np.asarray(filler_tokens)
    if len(stream) < length:  # short corpus: repeat it (the needle is what matters)
        stream = np.tile(stream, -(-length // max(1, len(stream))))
    start = rng.integers(0, len(stream) - length + 1)
    return stream[start:start + length]


def _with_distractors(rng, filler: np.ndarray, needles: list[np.ndarray]) -> np.ndarray:
    """Insert whole needles into filler at uniformly random offsets (order kept)."""
    if not needles:
        return filler
    offsets = np.sort(rng.integers(0, len(filler) + 1, size=len(needles)))
    parts, prev = [], 0
    for off, nd in zip(offsets, needles):
        parts += [filler[prev:off], nd]
        prev = off
    parts.append(filler[prev:])
    return np.concatenate(parts)


def generate(rng_or_seed, num_examples: int, seq_len: int, depth=None, kind: str = "passkey",
             num_keys: int = 4, filler_tokens=None, base_vocab: int = 256,
             filler_vocab: int | None = None, num_digits: int = 5, key_vocab: int = 64,
             key_len: int = 1) -> dict:
    """NIAH examples: dict(inputs, targets (N,T) int32, mask (N,T) float32,
    needle_pos (N,) int32 — where the queried [NEEDLE] sits in the inputs —,
    digits (N, num_digits) int32 — the answer, 0..9 —, depth (N,) float32).

    depth: a fraction in [0, 1], one per example (array), or None for uniform.
    filler_tokens: a 1-D token stream to cut the haystack from (ids < base_vocab);
    None draws random filler ids from [0, filler_vocab or base_vocab).
    """
    rng = _as_rng(rng_or_seed)
    N = int(num_examples)
    if kind == "multikey" and not 1 <= num_keys <= key_vocab ** key_len:
        raise ValueError(f"multikey NIAH needs num_keys >= 1 and enough distinct keys: "
                         f"num_keys={num_keys}, key_vocab={key_vocab}, key_len={key_len}")
    hay, needle_len, n_needles = layout(seq_len, kind, num_keys, num_digits, key_len)
    if depth is None:
        depths = rng.random(N)
    else:
        depths = np.broadcast_to(np.asarray(depth, np.float64), (N,)).copy()
    if ((depths < 0) | (depths > 1)).any():
        raise ValueError(f"NIAH depth must be in [0, 1], got {depth}")
    filler_vocab = int(filler_vocab or base_vocab)
    needle_id, q_id = base_vocab, base_vocab + 1
    digit0, key0 = base_vocab + 2, base_vocab + 12

    seqs = np.zeros((N, seq_len + 1), np.int64)
    mask = np.zeros((N, seq_len), np.float32)
    needle_pos = np.zeros((N,), np.int64)
    answers = np.zeros((N, num_digits), np.int64)
    n_filler = hay - n_needles * needle_len
    for i in range(N):
        digits = rng.integers(0, 10, size=(n_needles, num_digits))
        if kind == "multikey":
            # distinct keys of key_len ids each; needle 0 is the one queried
            flat = rng.choice(key_vocab ** key_len, size=n_needles, replace=False)
            keys = np.stack([(flat // key_vocab ** j) % key_vocab for j in range(key_len)], 1)
            needles = [np.concatenate([[needle_id], key0 + keys[j], digit0 + digits[j]])
                       for j in range(n_needles)]
            query = np.concatenate([[q_id], key0 + keys[0], digit0 + digits[0]])
        else:
            needles = [np.concatenate([[needle_id], digit0 + digits[0]])]
            query = np.concatenate([[q_id], digit0 + digits[0]])
        # The queried needle goes exactly at round(depth * (hay - needle_len)); the
        # distractors fall before or after it as uniform positions would put them,
        # as long as they fit on that side.
        pos = int(round(depths[i] * (hay - needle_len)))
        m = n_needles - 1
        before = int((rng.random(m) * hay < pos).sum())
        before = min(before, pos // needle_len)
        before = max(before, m - (hay - needle_len - pos) // needle_len)
        filler = _filler(rng, n_filler, filler_tokens, filler_vocab)
        pre_fill = pos - before * needle_len
        prefix = _with_distractors(rng, filler[:pre_fill], needles[1:1 + before])
        suffix = _with_distractors(rng, filler[pre_fill:], needles[1 + before:])
        seq = np.concatenate([prefix, needles[0], suffix, query])
        assert len(seq) == seq_len + 1 and len(prefix) == pos
        seqs[i] = seq
        answer_start = seq_len + 1 - num_digits  # index of d1 in the full sequence
        mask[i, answer_start - 1:seq_len] = 1.0  # targets there are d1..d5
        needle_pos[i] = pos
        answers[i] = digits[0]
    return {"inputs": seqs[:, :-1].astype(np.int32), "targets": seqs[:, 1:].astype(np.int32),
            "mask": mask, "needle_pos": needle_pos.astype(np.int32),
            "digits": answers.astype(np.int32), "depth": depths.astype(np.float32)}


class NIAHDataset(Dataset):
    """NIAH examples from rng([seed, step]); the held-out set from a separate stream.

    `tokenizer` (a WithSpecials) is the vocabulary so far (mixtures): NIAH's ids go
    after it. Without one, the text tokenizer named by `data.tokenizer` is used.
    """

    def __init__(self, cfg: Mapping, *, seed: int, tokenizer=None):
        from data.text import encode_documents, load_documents

        self.seed = int(seed)
        self.seq_len = int(cfg_get(cfg, "seq_len", 256))
        self.kind = cfg_get(cfg, "niah_kind", "passkey")
        self.num_keys = int(cfg_get(cfg, "num_keys", 4))
        self.key_vocab = int(cfg_get(cfg, "key_vocab", 64))
        self.num_digits = int(cfg_get(cfg, "num_digits", 5))
        self.key_len = int(cfg_get(cfg, "key_len", 1))
        depths = cfg_get(cfg, "niah_depths")
        self.depths = None if depths is None else np.asarray(list(depths), np.float64)
        layout(self.seq_len, self.kind, self.num_keys, self.num_digits, self.key_len)

        has_text = cfg_get(cfg, "files") is not None or cfg_get(cfg, "name") is not None
        docs = None
        if has_text:
            text_cfg = dict(cfg.items())
            text_cfg["source"] = cfg_get(cfg, "filler_source", "files" if cfg_get(cfg, "files") else "hf")
            docs = load_documents(text_cfg)
        if tokenizer is None:
            tokenizer = toks.WithSpecials(toks.build(
                cfg_get(cfg, "tokenizer", "byte"), docs,
                tokenizer_dir=cfg_get(cfg, "tokenizer_dir"), vocab_size=cfg_get(cfg, "vocab_size")))
        names = special_names(self.key_vocab)
        if tokenizer.has(NEEDLE):
            # another NIAH task of the same mixture: share its [NEEDLE], [Q], digit and
            # key ids, so passkey and multi-key examples speak one vocabulary
            self.base_vocab = tokenizer.id_of(NEEDLE)
            missing = [n for n in names if not tokenizer.has(n)]
            if missing or any(tokenizer.id_of(n) != self.base_vocab + i for i, n in enumerate(names)):
                raise ValueError("NIAH components of one mixture must share key_vocab "
                                 f"(this one needs {names[-1]!r})")
            self.tokenizer = tokenizer
        else:
            self.base_vocab = tokenizer.vocab_size
            self.tokenizer = tokenizer.extend(names)
        self.filler_vocab = int(cfg_get(cfg, "filler_vocab", tokenizer.base.vocab_size))
        # Haystack text: training batches cut it from the first (1 - val_fraction) of the
        # text, held-out batches (and `filler_tokens`, what eval.recall uses) from the
        # rest, unless the rest is too short to hold a haystack.
        self.filler_tokens = self.train_filler_tokens = None
        if docs is not None:
            stream = np.concatenate(encode_documents(tokenizer.base, docs))
            train, val = packing.split_stream(stream, float(cfg_get(cfg, "val_fraction", 0.1)))
            self.train_filler_tokens = train if len(train) >= self.seq_len else stream
            self.filler_tokens = val if len(val) >= self.seq_len else stream

    def _depths(self, rng, n):
        if self.depths is None:
            return None
        return rng.choice(self.depths, size=n)

    @property
    def packed(self) -> bool:
        """Every row is one example."""
        return False

    def _batch(self, step: int, batch_size: int, split: str) -> dict:
        rng = step_rng(self.seed, step, split)
        filler = self.train_filler_tokens if split == "train" else self.filler_tokens
        out = generate(rng, batch_size, self.seq_len, self._depths(rng, batch_size), self.kind,
                       self.num_keys, filler, self.base_vocab, self.filler_vocab,
                       self.num_digits, self.key_vocab, self.key_len)
        return packing.make_batch(out["inputs"], out["targets"], None, out["mask"])
