"""Needle in a haystack: passkey retrieval (Landmark Attention / RULER S-NIAH-1) and
multi-key retrieval (RULER MK-NIAH-1/2/3), with RULER's multi-value needles (MV-NIAH),
as token sequences for models trained from scratch.

Each example is seq_len + 1 tokens (inputs are the first seq_len, targets the last):

    passkey:   haystack ... [NEEDLE] d1..d5 ... haystack [Q] d1 d2 d3 d4 d5
    multikey:  ... [NEEDLE] K2 e1..e5 ... [NEEDLE] K7 d1..d5 ... [Q] K7 d1 d2 d3 d4 d5

The haystack (`haystack="filler"`, config `niah_haystack`) is filler text (windows of a
given token stream) or random filler ids. The queried needle starts at position
round(depth * (H - V L)) of the H-token haystack (L the needle length, V = num_values),
so depth 0 puts it first and depth 1 flush against the query. Multi-key distractor
needles (other keys, other digits) sit at random places around it. The loss mask is 1
exactly where the targets are the answer digits.

RULER's harder needles (NVIDIA/RULER at c3f5e3b, scripts/synthetic.yaml and
scripts/data/synthetic/niah.py), here:

- MK-NIAH-2 (`niah_multikey_2`: type_haystack needle, keys words, values numbers): the
  whole haystack is needles, `haystack="needles"` with kind multikey. Every haystack
  needle has its own key (distinct from the queried one and from each other: RULER draws
  them independently, where a repeat is rare; here a repeat would make the answer
  ambiguous) and its own value; num_keys is not used. The H tokens hold floor(H / L)
  needles; the H mod L tokens left over are filler at the very start (RULER's prompt
  opens with a sentence before the needles too). The queried needle takes slot
  round(depth * (n - V)) of the n slots, so it starts at (H mod L) + slot * L. RULER's
  keys are adjective-noun words, several tokens each, drawn from a pool of thousands;
  here a key is `key_len` ids of `key_vocab` (configs/compare_niah.py: 2 ids, 4,096 keys,
  enough for the ~400 needles of a 4,096-token haystack).
- MK-NIAH-3 (`niah_multikey_3`: type_haystack needle, keys and values UUIDs): the same
  with long keys and long values; RULER's UUIDs are 32 hex digits (122 random bits).
  Here `key_len` ids and `num_digits` decimal digits (configs/compare_niah.py: 4 ids and
  16 digits, 24 + 53 bits).
- MV-NIAH (`niah_multivalue`: num_needle_k 1, num_needle_v 4): `num_values` > 1. Every
  key (the queried one and each multi-key distractor) appears in num_values needles with
  different values; the answer is all the queried key's values in document order
  (RULER scores them in any order, a teacher-forced answer needs one). The first of the
  queried needles sits at the requested depth, the others at random places after it.
  With a needle haystack, the queried key's V needles sit among single-value needles of
  other keys.
- Values: RULER's numbers have 7 digits (the first one nonzero); `num_digits=7`. Here
  every digit is uniform in 0-9, the first one too.

num_values=1 with the filler haystack draws exactly the examples it drew before these
options existed (the same random calls in the same order; tested bitwise).

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
HAYSTACKS = ("filler", "needles")
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


def layout(seq_len: int, kind: str, num_keys: int, num_digits: int, key_len: int,
           haystack: str = "filler", num_values: int = 1):
    """(haystack length, needle length, number of needles) for one example.

    The query part, [Q] (key) then num_values * num_digits answer digits, ends the
    sequence; the haystack is the seq_len + 1 tokens before it. A needle haystack holds
    floor(haystack / needle length) needles (the queried key's num_values among them)."""
    if kind not in KINDS:
        raise ValueError(f"NIAH kind must be one of {KINDS}, got {kind!r}")
    if haystack not in HAYSTACKS:
        raise ValueError(f"NIAH haystack must be one of {HAYSTACKS}, got {haystack!r}")
    if haystack == "needles" and kind != "multikey":
        raise ValueError("a NIAH haystack of needles (RULER MK-NIAH-2/3) needs keys to "
                         "tell the queried needle from the others: use niah_kind=multikey")
    if num_values < 1:
        raise ValueError(f"NIAH num_values={num_values}: use 1 or more")
    key = key_len if kind == "multikey" else 0
    needle_len = 1 + key + num_digits
    hay = seq_len + 1 - (1 + key + num_values * num_digits)
    if haystack == "needles":
        n_needles = max(hay, 0) // needle_len
        if n_needles < num_values + 1:
            raise ValueError(f"NIAH seq_len={seq_len} is too short for a haystack of "
                             f"needles: {num_values} queried and at least one other needle "
                             f"of {needle_len} tokens, and the query; raise seq_len")
        return hay, needle_len, n_needles
    n_needles = (num_keys if kind == "multikey" else 1) * num_values
    # at least one needle's worth of filler, so the queried needle can go at any depth
    if hay < (n_needles + 1) * needle_len:
        raise ValueError(f"NIAH seq_len={seq_len} is too short for {n_needles} needle(s) "
                         f"of {needle_len} tokens, as much filler, and the query; raise "
                         "seq_len")
    return hay, needle_len, n_needles


def check(seq_len: int, kind: str, num_keys: int, num_digits: int, key_vocab: int,
          key_len: int, haystack: str = "filler", num_values: int = 1):
    """layout(), and that there are enough distinct keys; raises ValueError naming the
    fix."""
    out = layout(seq_len, kind, num_keys, num_digits, key_len, haystack, num_values)
    n_needles = out[2]
    if haystack == "needles":
        if n_needles - num_values + 1 > key_vocab ** key_len:
            raise ValueError(
                f"a NIAH haystack of needles at seq_len={seq_len} holds {n_needles} "
                f"needles of {n_needles - num_values + 1} distinct keys, more than "
                f"key_vocab ** key_len = {key_vocab}^{key_len} = {key_vocab ** key_len}: "
                "raise key_len")
    elif kind == "multikey" and not 1 <= num_keys <= key_vocab ** key_len:
        raise ValueError(f"multikey NIAH needs num_keys >= 1 and enough distinct keys: "
                         f"num_keys={num_keys}, key_vocab={key_vocab}, key_len={key_len}")
    return out


def _filler(rng, length: int, filler_tokens, filler_vocab: int) -> np.ndarray:
    if filler_tokens is None:
        return rng.integers(0, filler_vocab, size=length)
    stream = np.asarray(filler_tokens)
    if len(stream) < length:  # short corpus: repeat it (the needle is what matters)
        stream = np.tile(stream, -(-length // max(1, len(stream))))
    start = rng.integers(0, len(stream) - length + 1)
    return stream[start:start + length]


def _with_distractors(rng, filler: np.ndarray,
                      needles: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Insert whole needles into filler at uniformly random offsets (order kept); also
    where each needle starts in the result."""
    if not needles:
        return filler, []
    offsets = np.sort(rng.integers(0, len(filler) + 1, size=len(needles)))
    parts, prev, starts, done = [], 0, [], 0
    for off, nd in zip(offsets, needles):
        parts += [filler[prev:off], nd]
        starts.append(int(off) + done)
        done += len(nd)
        prev = off
    parts.append(filler[prev:])
    return np.concatenate(parts), starts


def _keys(rng, count: int, key_vocab: int, key_len: int) -> np.ndarray:
    """`count` distinct keys of key_len ids each, (count, key_len)."""
    flat = rng.choice(key_vocab ** key_len, size=count, replace=False)
    return np.stack([(flat // key_vocab ** j) % key_vocab for j in range(key_len)], 1)


def generate(rng_or_seed, num_examples: int, seq_len: int, depth=None,
             kind: str = "passkey", num_keys: int = 4, filler_tokens=None,
             base_vocab: int = 256, filler_vocab: int | None = None, num_digits: int = 5, key_vocab: int = 64,
             key_len: int = 1, haystack: str = "filler", num_values: int = 1) -> dict:
    """NIAH examples: dict(inputs, targets (N,T) int32, mask (N,T) float32,
    needle_pos (N,) int32 — where the (first) queried [NEEDLE] sits in the inputs —,
    value_pos (N, num_values) int32 — where each queried [NEEDLE] sits, in document
    order —, digits (N, num_values * num_digits) int32 — the answer, 0..9, the values in
    document order —, depth (N,) float32).

    depth: a fraction in [0, 1], one per example (array), or None for uniform.
    filler_tokens: a 1-D token stream to cut the haystack from (ids < base_vocab);
    None draws random filler ids from [0, filler_vocab or base_vocab).
    haystack: "filler" (text or random ids with the needles in it) or "needles" (RULER
    MK-NIAH-2/3: every haystack needle another key's; kind multikey).
    num_values: needles per key, each with its own value (RULER MV-NIAH); the answer is
    the queried key's values in document order.
    """
    rng = _as_rng(rng_or_seed)
    N = int(num_examples)
    V = int(num_values)
    hay, needle_len, n_needles = check(seq_len, kind, num_keys, num_digits, key_vocab,
                                       key_len, haystack, V)
    if depth is None:
        depths = rng.random(N)
    else:
        depths = np.broadcast_to(np.asarray(depth, np.float64), (N,)).copy()
    if ((depths < 0) | (depths > 1)).any():
        raise ValueError(f"NIAH depth must be in [0, 1], got {depth}")
    filler_vocab = int(filler_vocab or base_vocab)
    ids = dict(needle=base_vocab, query=base_vocab + 1, digit0=base_vocab + 2,
               key0=base_vocab + 12)
    A = V * num_digits  # answer tokens

    seqs = np.zeros((N, seq_len + 1), np.int64)
    mask = np.zeros((N, seq_len), np.float32)
    value_pos = np.zeros((N, V), np.int64)
    answers = np.zeros((N, A), np.int64)
    answer_start = seq_len + 1 - A  # index of the first answer digit in the full sequence
    for i in range(N):
        if haystack == "needles":
            seq, starts, digits = _needle_haystack(
                rng, depths[i], hay, needle_len, n_needles, V, num_digits, key_vocab,
                key_len, filler_tokens, filler_vocab, ids)
        else:
            seq, starts, digits = _filler_haystack(
                rng, depths[i], kind, hay, needle_len, n_needles, V, num_keys, num_digits,
                key_vocab, key_len, filler_tokens, filler_vocab, ids)
        assert len(seq) == seq_len + 1, (len(seq), seq_len)
        seqs[i] = seq
        mask[i, answer_start - 1:seq_len] = 1.0  # targets there are the answer digits
        value_pos[i] = starts
        answers[i] = digits
    return {"inputs": seqs[:, :-1].astype(np.int32),
            "targets": seqs[:, 1:].astype(np.int32), "mask": mask, "needle_pos": value_pos[:, 0].astype(np.int32),
            "value_pos": value_pos.astype(np.int32),
            "digits": answers.astype(np.int32), "depth": depths.astype(np.float32)}


def _query(ids, key, digits) -> np.ndarray:
    """[Q] (key ids) answer digits."""
    return np.concatenate([[ids["query"]], ids["key0"] + np.asarray(key, np.int64),
                           ids["digit0"] + np.asarray(digits, np.int64).ravel()])


def _filler_haystack(rng, depth, kind, hay, needle_len, n_needles, V, num_keys, num_digits,
                     key_vocab, key_len, filler_tokens, filler_vocab, ids):
    """One example in filler: (sequence, queried needles' starts, answer digits).

    With V = 1 the random calls are those of the generator before num_values existed
    (so the examples are bitwise the same)."""
    # row j V + v: key j's value v
    digits = rng.integers(0, 10, size=(n_needles, num_digits))
    if kind == "multikey":
        # distinct keys of key_len ids each; key 0 is the one queried
        keys = _keys(rng, num_keys, key_vocab, key_len)
        key_of = [keys[j // V] for j in range(n_needles)]
    else:
        key_of = [np.zeros((0,), np.int64)] * n_needles
    needles = [np.concatenate([[ids["needle"]], ids["key0"] + key_of[j],
                               ids["digit0"] + digits[j]]) for j in range(n_needles)]
    queried, distractors = needles[:V], needles[V:]
    # The first queried needle goes exactly at round(depth * (hay - V needle_len)); the
    # distractors fall before or after it as uniform positions would put them, as long
    # as they fit on that side (after it: the other queried needles too).
    pos = int(round(depth * (hay - V * needle_len)))
    m = n_needles - V
    before = int((rng.random(m) * hay < pos).sum())
    before = min(before, pos // needle_len)
    before = max(before, m - (hay - V * needle_len - pos) // needle_len)
    filler = _filler(rng, hay - n_needles * needle_len, filler_tokens, filler_vocab)
    pre_fill = pos - before * needle_len
    prefix, _ = _with_distractors(rng, filler[:pre_fill], distractors[:before])
    after = list(distractors[before:])
    is_value = [False] * len(after)
    if V > 1:  # the other queried needles go anywhere after the first, among distractors
        after += queried[1:]
        is_value += [True] * (V - 1)
        order = rng.permutation(len(after))
        after = [after[o] for o in order]
        is_value = [is_value[o] for o in order]
    suffix, starts = _with_distractors(rng, filler[pre_fill:], after)
    assert len(prefix) == pos
    value_starts = [pos] + [pos + needle_len + s for s, v in zip(starts, is_value) if v]
    # the answer: the queried key's values in document order
    seq_parts = [prefix, queried[0], suffix]
    body = np.concatenate(seq_parts)
    value_digits = np.stack([body[s + needle_len - num_digits:s + needle_len]
                             for s in value_starts]) - ids["digit0"]
    key = key_of[0]
    return (np.concatenate([body, _query(ids, key, value_digits)]), value_starts,
            value_digits.ravel())


def _needle_haystack(rng, depth, hay, needle_len, n_needles, V, num_digits, key_vocab,
                     key_len, filler_tokens, filler_vocab, ids):
    """One example whose haystack is needles (RULER MK-NIAH-2/3): (sequence, queried
    needles' starts, answer digits)."""
    n_other = n_needles - V
    digits = rng.integers(0, 10, size=(n_needles, num_digits))  # rows 0..V-1: the answer
    keys = _keys(rng, n_other + 1, key_vocab, key_len)          # key 0 is the one queried
    slot0 = int(round(depth * (n_needles - V)))
    slots = [slot0]
    if V > 1:
        slots += sorted(slot0 + 1 + rng.choice(n_needles - slot0 - 1, V - 1, replace=False))
    is_value = np.zeros(n_needles, bool)
    is_value[slots] = True
    # needle k of the haystack, in document order: the queried key's at `slots`, the
    # other keys' (one needle each) in the rest
    row_of = np.empty(n_needles, np.int64)
    row_of[slots] = np.arange(V)
    row_of[~is_value] = np.arange(V, n_needles)
    key_row = np.where(is_value, 0, row_of - V + 1)
    block = np.empty((n_needles, needle_len), np.int64)
    block[:, 0] = ids["needle"]
    block[:, 1:1 + key_len] = ids["key0"] + keys[key_row]
    block[:, 1 + key_len:] = ids["digit0"] + digits[row_of]
    lead = hay - n_needles * needle_len  # filler before the needles
    preamble = _filler(rng, lead, filler_tokens, filler_vocab)
    starts = [lead + s * needle_len for s in slots]
    seq = np.concatenate([preamble, block.ravel(), _query(ids, keys[0], digits[:V])])
    return seq, starts, digits[:V].ravel()


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
        self.haystack = cfg_get(cfg, "niah_haystack", "filler")
        self.num_values = int(cfg_get(cfg, "num_values", 1))
        depths = cfg_get(cfg, "niah_depths")
        self.depths = None if depths is None else np.asarray(list(depths), np.float64)
        check(self.seq_len, self.kind, self.num_keys, self.num_digits, self.key_vocab,
              self.key_len, self.haystack, self.num_values)

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
                       self.num_digits, self.key_vocab, self.key_len, self.haystack,
                       self.num_values)
        return packing.make_batch(out["inputs"], out["targets"], None, out["mask"])
