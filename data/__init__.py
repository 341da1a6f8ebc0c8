"""Data for training and evaluation: `data.build(cfg_data, seed=...) -> Dataset`.

Every Dataset has `vocab_size`, `tokenizer` (encode/decode/to_config),
`batch(step, batch_size, split="train")` -> dict of NumPy arrays
(`inputs`, `targets` (B,T) int32, `mask` (B,T) float32, `segment_ids` (B,T) int32),
a pure function of (seed, step, split), `eval_batches(batch_size, num_batches)`
over the held-out split, and `packed`: whether a row may hold several documents (else the
model is given no segment ids). NumPy only: no jax, and `datasets` / `tensorflow_datasets` /
`sentencepiece` are imported only by the code paths that need them.

Config keys (`cfg_data` is any Mapping: a dict or an ml_collections ConfigDict;
a key set to None counts as unset). Defaults in brackets.

Common
  source          files | hf | tfds | store | mqar | niah | mixture    [files]
  seq_len         tokens per row (inputs and targets)                  [256; mqar 64]

Text (files, hf, tfds)
  files           path, glob, or list of them (source=files)
  sample_by       document | paragraph | line: one document per ...   [document]
  encoding_errors
                  strict: invalid UTF-8 stops, naming the file and     [strict]
                  line; replace: bad bytes read as U+FFFD
  cache_dir       `datasets` cache directory                           [HF default]
  name            hub dataset name (hf) or TFDS name (tfds)
  subset          hub dataset configuration name (hf)                  [None]
  split           source split to read                                 [train]
  val_split       a separate source split (or file set) held out       [None: use val_fraction]
  text_field      field holding the text (hf, tfds)                    [text]
  max_documents   documents to take (hf streaming; tfds); a cut is     [hf 10000; tfds all]
                  said in one line (used of how many); 0 takes all
  data_dir        TFDS data directory                                  [TFDS default]
  tokenizer       byte | char | sentencepiece | a Hugging Face name    [byte]
  tokenizer_dir   where char_vocab.json / the SentencePiece model live [None]
  vocab_size      SentencePiece vocabulary size (tokenizer=sentencepiece)
  val_fraction    last fraction of the token stream held out           [0.1]
  packing         random_windows (nanoGPT) | rows (stride seq_len,
                  a fresh permutation per epoch)                       [random_windows]
  eod             add an end-of-document id after the tokenizer's
                  vocabulary                                           [None: when documents
                                                                        can meet in a row:
                                                                        packing=rows or
                                                                        more than one document]

Token store (source=store; written by `python -m data.prepare`, see data/store.py)
  store           the store directory
  tokenizer       must name the store's tokenizer (checked)            [byte]
  packing, val_fraction, seq_len   as for text; the batches equal the in-memory
                  path's on the same corpus (data/store_dataset.py)
  prefetch        training batches read ahead on a background thread
                  (0: none; batches are the same either way)          [2]
  verify_store    check every shard's sha256 when the run starts       [True]

MQAR (source=mqar; Zoology's layout, see data/mqar.py)
  vocab_size      task vocabulary (keys [1,V/2), values [V/2,V))       [8192]
                  (mqar_vocab_size, if set, wins over vocab_size)
  num_kv_pairs    key-value pairs per example, or a list: each row
                  draws one of them                                    [4]
                  or Zoology's mixture of settings [[seq_len, kv,
                  weight], ...]: each row draws one (p ~ weight), padded
                  with masked filler to seq_len, each query's mask 1/kv
  power_a         query-gap power law exponent                         [0.01]
  random_non_queries  fill with random tokens instead of 0             [False]

NIAH (source=niah; see data/niah.py)
  niah_kind       passkey | multikey                                   [passkey]
  niah_depths     depths to sample from, fractions in [0,1]            [None: uniform]
  num_keys        keys in a multikey haystack of filler                [4]
  key_vocab       reserved key ids                                     [64]
  key_len         ids per key (multikey)                               [1]
  num_digits      digits per value (RULER's numbers have 7)            [5]
  niah_haystack   filler (text or random ids) | needles (RULER
                  MK-NIAH-2/3: every haystack needle another key's;
                  niah_kind=multikey)                                  [filler]
  num_values      needles per key, each its own value (RULER MV-NIAH);
                  the answer is all the queried key's, in document
                  order                                                [1]
  files / name    text for the haystack, tokenised with `tokenizer`    [None: random filler]
  filler_source   files | hf | tfds: where files/name point            [files if files else hf]
  filler_vocab    random filler ids drawn from [0, filler_vocab)       [text tokenizer vocab]

Mixture (source=mixture; see data/mixture.py)
  components      list of sub-configs each with a `weight` [1], or a dict
                  name -> sub-config. Sub-configs inherit the top-level keys
                  they do not set (seq_len, tokenizer, files, ...), except
                  vocab_size (top level: the text tokenizer's).
                  Ids: text (+ EOD) first, then each task's own range.

Held-out data: text keeps the last val_fraction of its tokens (eval_batches walks it
in order); synthetic tasks draw their held-out batches from rng([seed, i, EVAL_STREAM]).
"""
from __future__ import annotations

from typing import Mapping

from data.base import BATCH_KEYS, Dataset, cfg_get

SOURCES = ("files", "hf", "tfds", "store", "mqar", "niah", "mixture")


def build(cfg_data: Mapping, *, seed: int, tokenizer=None) -> Dataset:
    """The Dataset that `cfg_data.source` names.

    `tokenizer` is for mixtures: text components share one tokenizer, and each
    synthetic task appends its own ids after the vocabulary built so far.
    """
    source = cfg_get(cfg_data, "source", "files")
    if source in ("files", "hf", "tfds"):
        from data.text import TextDataset
        return TextDataset(cfg_data, seed=seed, tokenizer=tokenizer)
    if source == "store":
        from data.store_dataset import StoreDataset
        ds = StoreDataset(cfg_data, seed=seed, tokenizer=tokenizer)
        depth = int(cfg_get(cfg_data, "prefetch", 2))
        if depth < 0:
            raise ValueError(f"data.prefetch={depth}: use a number of batches >= 0")
        if depth > 0:
            from data.prefetch import Prefetched
            ds = Prefetched(ds, depth)
        return ds
    if source == "mqar":
        from data.mqar import MQARDataset
        return MQARDataset(cfg_data, seed=seed, tokenizer=tokenizer)
    if source == "niah":
        from data.niah import NIAHDataset
        return NIAHDataset(cfg_data, seed=seed, tokenizer=tokenizer)
    if source == "mixture":
        from data.mixture import MixtureDataset
        return MixtureDataset(cfg_data, seed=seed)
    raise ValueError(f"unknown data.source {source!r}; valid sources: {', '.join(SOURCES)}")


__all__ = ["build", "Dataset", "SOURCES", "BATCH_KEYS"]
