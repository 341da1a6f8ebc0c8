"""The token store on disk: what `python -m data.prepare` writes and `source=store` reads.

A store is one directory:

  manifest.json               format, version, tokenizer identity, eod_id, dtype,
                              documents, tokens, and one entry per shard (its files,
                              documents, tokens, sha256 of each file)
  tokenizer.json              the tokenizer's `to_config()` (a SentencePiece model is
                              copied beside it as tokenizer.model, referred to relatively)
  shard_00000.tokens.npy      1-D uint16 (uint32 past 65,536 ids): each document's
                              token ids followed by the end-of-document id
  shard_00000.offsets.npy     1-D int64, documents + 1 entries: document i is
                              tokens[offsets[i]:offsets[i+1] - 1], its EOD at offsets[i+1] - 1

Why this format: a `.npy` file is numpy's own documented format, read memory-mapped by
`np.load(path, mmap_mode="r")` with no extra dependency (array_record is installed here
but not on the GPU machine, and its records are byte strings we would decode per row:
a flat token array maps straight onto packed rows by slicing). The EOD is stored with the
tokens so that the concatenation of the shards *is* the packed stream the in-memory path
builds (data/packing.concat_documents), and a row is one slice of a memory map.

Every file is written to `NAME.tmp` and renamed into place (a rename is atomic on one
file system), and a shard counts as finished only once its `shard_K.json` record is
renamed in, after both arrays: a killed preparation leaves whole shards or nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

import numpy as np

FORMAT = "linmix-token-store"
VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
SETTINGS = "prepare_settings.json"  # a partial store's arguments, to refuse a mixed rerun


class StoreError(ValueError):
    """A store that cannot be used as it is; the message names the file and the fix.
    A ValueError, so the training CLI reports it as one `data:` line."""


def shard_name(index: int) -> str:
    return f"shard_{index:05d}"


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id (the EOD included)."""
    return np.dtype(np.uint16) if vocab_size <= 2 ** 16 else np.dtype(np.uint32)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 23) -> str:
    """Read in 8 MiB chunks: hashing a large shard never holds it in memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_atomic_bytes(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: pathlib.Path, obj: Any) -> None:
    # sort_keys and no timestamps: the same store gives the same bytes.
    write_atomic_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def write_array(path: pathlib.Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(directory: pathlib.Path, index: int, docs: list[np.ndarray], eod_id: int,
                dtype: np.dtype, first_document: int) -> dict:
    """Writes shard `index` (its arrays, then its record) and returns the record."""
    lengths = np.array([len(d) + 1 for d in docs], np.int64)
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), dtype)
    for d, start, n in zip(docs, offsets[:-1], lengths):
        tokens[start:start + n - 1] = d
        tokens[start + n - 1] = eod_id
    name = shard_name(index)
    write_array(directory / f"{name}.tokens.npy", tokens)
    write_array(directory / f"{name}.offsets.npy", offsets)
    record = {"index": index, "tokens_file": f"{name}.tokens.npy",
              "offsets_file": f"{name}.offsets.npy", "documents": len(docs),
              "first_document": int(first_document), "tokens": int(offsets[-1]),
              "tokens_sha256": sha256_file(directory / f"{name}.tokens.npy"),
              "offsets_sha256": sha256_file(directory / f"{name}.offsets.npy")}
    write_json(directory / f"{name}.json", record)
    return record


def read_json(path: pathlib.Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{what} {path} is not valid JSON ({e}); prepare the store "
                         "again with python -m data.prepare") from None


def tokenizer_identity(tokenizer, directory: pathlib.Path | None = None) -> dict:
    """What names a tokenizer: its kind, vocabulary size and a sha256 of what defines its
    mapping (the char list, the SentencePiece model file, the HF tokenizer JSON), so
    that two stores agree on ids only if their identities are equal."""
    cfg = tokenizer.to_config()
    kind = cfg["kind"]
    if kind == "sentencepiece":
        digest = sha256_file(cfg["model_file"])
    elif kind == "hf" and getattr(tokenizer, "_fast", False):
        digest = hashlib.sha256(tokenizer._tok.to_str().encode()).hexdigest()
    else:  # byte, char, integer, a slow HF tokenizer: the config holds all of it
        digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
    name = {"hf": cfg.get("name")}.get(kind, kind)
    return {"kind": kind, "name": name, "vocab_size": int(tokenizer.vocab_size),
            "sha256": digest}


def load_manifest(directory: str | os.PathLike) -> tuple[pathlib.Path, dict]:
    """The manifest of a finished store, checked against its own shard list."""
    directory = pathlib.Path(os.path.expanduser(str(directory)))
    if not directory.is_dir():
        raise StoreError(f"token store {directory} does not exist; make it with "
                         f"python -m data.prepare --files=... --out={directory}")
    path = directory / MANIFEST
    if not path.exists():
        partial = sorted(p.name for p in directory.glob("shard_*.json"))
        hint = (f" ({len(partial)} shards are done: the preparation was stopped; run the "
                "same python -m data.prepare command again to finish it)") if partial else ""
        raise StoreError(f"token store {directory} has no {MANIFEST}{hint}")
    m = read_json(path, "store manifest")
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise StoreError(f"{path} is not a version-{VERSION} {FORMAT} manifest (format "
                         f"{m.get('format')!r}, version {m.get('version')!r}); prepare "
                         "the store again")
    shards = m.get("shards", [])
    for key, total in (("documents", sum(s["documents"] for s in shards)),
                       ("tokens", sum(s["tokens"] for s in shards))):
        if m.get(key) != total:
            raise StoreError(f"store manifest {path} does not match itself: it counts "
                             f"{m.get(key)} {key} but its shards hold {total}; the manifest "
                             "was edited or mixed with another store's: prepare it again")
    if m.get("num_shards") != len(shards) or [s["index"] for s in shards] != list(range(len(shards))):
        raise StoreError(f"store manifest {path} does not match itself: num_shards "
                         f"{m.get('num_shards')} but shards {[s['index'] for s in shards]}; "
                         "prepare the store again")
    return directory, m


def open_shard(directory: pathlib.Path, record: dict, dtype: np.dtype, *,
               verify: bool) -> tuple[np.ndarray, np.ndarray]:
    """Shard `record`'s tokens and offsets, memory-mapped (nothing is read yet), after
    checking that the files exist, have the shapes the manifest states and, with
    `verify`, their sha256."""
    arrays = []
    for kind, want_dtype, length in (("tokens", dtype, record["tokens"]),
                                     ("offsets", np.dtype(np.int64), record["documents"] + 1)):
        path = directory / record[f"{kind}_file"]
        if not path.exists():
            raise StoreError(f"token store shard file {path} is missing; prepare the store "
                             "again (python -m data.prepare with the same arguments "
                             "rewrites only what is missing after you delete manifest.json)")
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise StoreError(f"token store shard file {path} is damaged ({e}); delete it and "
                             "prepare the store again") from None
        if a.dtype != want_dtype or a.shape != (length,):
            raise StoreError(f"token store shard file {path} is damaged or does not match "
                             f"the manifest: {a.dtype}{list(a.shape)}, the manifest says "
                             f"{want_dtype}[{length}]; prepare the store again")
        if verify and sha256_file(path) != record[f"{kind}_sha256"]:
            raise StoreError(f"token store shard file {path} is damaged: its sha256 differs "
                             "from the manifest's; delete it and prepare the store again")
        arrays.append(a)
    tokens, offsets = arrays
    if offsets[0] != 0 or offsets[-1] != record["tokens"]:
        raise StoreError(f"token store shard {directory / record['offsets_file']} does not "
                         "match its tokens (offsets do not span the shard); prepare again")
    return tokens, offsets


def load_tokenizer(directory: pathlib.Path, manifest: dict):
    """The tokenizer saved beside the store, checked against the manifest's identity."""
    from data import tokenizers as toks

    path = directory / TOKENIZER
    if not path.exists():
        raise StoreError(f"token store {directory} has no {TOKENIZER}; prepare it again")
    cfg = read_json(path, "store tokenizer")
    if cfg.get("kind") == "sentencepiece":  # stored relative to the store directory
        cfg = dict(cfg, model_file=str(directory / cfg["model_file"]))
    tok = toks.from_config(cfg)
    ident = tokenizer_identity(tok)
    if ident != manifest["tokenizer"]:
        raise StoreError(f"the tokenizer saved in {path} ({ident['name']}, vocab "
                         f"{ident['vocab_size']}) is not the one the manifest names "
                         f"({manifest['tokenizer']['name']}, vocab "
                         f"{manifest['tokenizer']['vocab_size']}, sha256 differs: "
                         f"{ident['sha256'] != manifest['tokenizer']['sha256']}); "
                         "prepare the store again")
    return tok
