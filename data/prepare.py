"""Tokenize local text files or a Hugging Face dataset once into a token store
(format: data/store.py).

    python -m data.prepare --files='corpus/*.txt' --out=stores/corpus [--tokenizer=byte]
    python -m data.prepare --hf_name=NAME [--hf_subset=S --hf_split=train
        --text_field=text --max_documents=N] --out=stores/NAME

Documents are the files' (or their paragraphs' / lines', --sample_by) in the order
`data.files` reads them (each glob sorted), or a hub dataset's examples streamed in its
order (`datasets.load_dataset(..., streaming=True)`; a local folder of data files works
offline), empty ones dropped as the in-memory path drops them. Shards close once they hold --shard_tokens tokens (a document is never
split). Killed at any moment, the same command carries on: finished shards are kept
(their files checked against their records), the documents they hold are skipped
unread by the tokenizer, and the store that results is byte for byte the one an
uninterrupted run writes. Rerun on a finished store, it checks it and exits.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
from typing import Iterator, Sequence

import numpy as np

from data import sources
from data import store as st
from data import tokenizers as toks


def iter_documents(paths: Sequence[str], sample_by: str, progress=None,
                   chunk_chars: int = 1 << 24, encoding_errors: str = "strict"
                   ) -> Iterator[str]:
    """The documents of `paths`. By paragraph or line a file is read `chunk_chars`
    characters at a time, so memory holds one chunk, not the file: the text after the
    chunk's last separator is carried into the next, which splits exactly as
    `str.split("\n\n")` / `str.splitlines()` of the whole file (data.sources' units).
    Invalid UTF-8 raises data.sources.TextDecodeError naming the file and line, unless
    encoding_errors="replace"."""
    if sample_by not in sources.SAMPLE_BY:
        raise ValueError(f"--sample_by must be one of {sources.SAMPLE_BY}, got {sample_by!r}")
    errors = sources.check_encoding_errors(encoding_errors)
    for path in paths:
        # Text mode with universal newlines, as pathlib.read_text (data.sources) reads.
        with open(path, encoding="utf-8", errors=errors) as f:
            try:
                if sample_by == "document":
                    docs = [f.read()]
                else:
                    docs = _split_chunks(f, sample_by, chunk_chars)
                for doc in docs:
                    if doc:
                        yield doc
            except UnicodeDecodeError:
                raise sources.TextDecodeError(sources.find_decode_error(path) or
                                              f"text file {path} is not valid UTF-8") from None
        if progress is not None:
            progress.update(os.path.getsize(path))


def _split_chunks(f, sample_by: str, chunk_chars: int) -> Iterator[str]:
    carry = ""
    while chunk := f.read(chunk_chars):
        text = carry + chunk
        if sample_by == "paragraph":
            parts = text.split("\n\n")
            carry = parts.pop()
            yield from parts
        else:
            # keepends: the last piece may be a line whose end (or "\r\n") is still to come.
            parts = text.splitlines(keepends=True)
            carry = parts.pop() if parts else ""
            for line in parts:
                yield line.splitlines()[0] if line.splitlines() else ""
    if sample_by == "paragraph":
        yield carry
    else:
        yield from carry.splitlines()


def iter_hf(name: str, *, subset: str | None, split: str, text_field: str,
            max_documents: int | None, progress=None) -> Iterator[str]:
    """The documents of a hub dataset, streamed: memory holds one example at a time."""
    ds = sources.open_hf(name, subset=subset, split=split, streaming=True, asked_by="--hf_name",
                         offline_hint="give a local directory of data files as --hf_name, "
                                      "or use --files")
    for i, ex in enumerate(ds):
        if max_documents and i >= max_documents:
            break
        doc = sources._text_of(ex, text_field, f"dataset {name!r}")
        if progress is not None:
            progress.update(1)
        if doc:
            yield doc


def build_tokenizer(name: str, documents, out: pathlib.Path,
                    vocab_size: int | None, tokenizer_dir: str | None):
    """The tokenizer to save beside the store; `char` and `sentencepiece` are trained on
    the whole corpus, as the in-memory path trains them (char by one streaming pass;
    SentencePiece holds the corpus's lines in memory while it trains)."""
    if name == "char" and not (tokenizer_dir and
                               (pathlib.Path(tokenizer_dir) / "char_vocab.json").exists()):
        chars: set[str] = set()
        for doc in documents():
            chars.update(doc)
        return toks.CharTokenizer(sorted(chars))
    if name == "sentencepiece":
        if not vocab_size:
            raise ValueError("--tokenizer=sentencepiece needs --vocab_size")
        train_dir = tokenizer_dir or str(out / "sentencepiece")
        return toks.build(name, list(documents()),
                          tokenizer_dir=train_dir, vocab_size=vocab_size)
    return toks.build(name, None, tokenizer_dir=tokenizer_dir, vocab_size=vocab_size)


def save_tokenizer(tokenizer, out: pathlib.Path) -> None:
    cfg = tokenizer.to_config()
    if cfg["kind"] == "sentencepiece":  # copied in, so the store travels as one folder
        shutil.copyfile(cfg["model_file"], out / "tokenizer.model")
        cfg = dict(cfg, model_file="tokenizer.model")
    st.write_json(out / st.TOKENIZER, cfg)


def finished_shards(out: pathlib.Path) -> list[dict]:
    """The records of shards 0, 1, ... that are complete and intact; the first one that
    is not ends the list and it and every later shard file are removed."""
    done = []
    while True:
        name = st.shard_name(len(done))
        rec_path = out / f"{name}.json"
        if not rec_path.exists():
            break
        rec = st.read_json(rec_path, "shard record")
        intact = all((out / rec[f"{k}_file"]).exists()
                     and st.sha256_file(out / rec[f"{k}_file"]) == rec[f"{k}_sha256"]
                     for k in ("tokens", "offsets"))
        if not intact:
            print(f"shard {name} is damaged; writing it again", file=sys.stderr)
            break
        done.append(rec)
    for p in out.glob("shard_*"):
        index = int(p.name.split("_")[1].split(".")[0])
        if index >= len(done):
            p.unlink()
    return done


def prepare(files, out, *, tokenizer: str = "byte", sample_by: str = "document",
            shard_tokens: int = 1 << 26, vocab_size: int | None = None,
            tokenizer_dir: str | None = None, max_shards: int | None = None,
            progress: bool = True, hf_name: str | None = None, hf_subset: str | None = None,
            hf_split: str = "train", text_field: str = "text",
            max_documents: int | None = None, encoding_errors: str = "strict") -> dict | None:
    """Writes (or finishes) the store in `out` from `files` or, with `files` None, the
    hub dataset `hf_name`; returns its manifest, or None when it stopped after
    `max_shards` new shards (what a kill leaves, for tests)."""
    if shard_tokens <= 0:
        raise ValueError(f"--shard_tokens must be positive, got {shard_tokens}")
    if (files is None) == (hf_name is None):
        raise ValueError("give either --files (local text) or --hf_name (a hub dataset)")
    out = pathlib.Path(os.path.expanduser(str(out)))
    settings = {"tokenizer": tokenizer, "shard_tokens": int(shard_tokens),
                "vocab_size": vocab_size}
    if files is not None:
        paths = sources.resolve_files(files)
        settings.update(files=paths, sample_by=sample_by)
        errors = sources.check_encoding_errors(encoding_errors)
        if errors != "strict":  # recorded only when set: older stores' settings stay equal
            settings["encoding_errors"] = errors

        def documents(bar=None):
            return iter_documents(paths, sample_by, bar, encoding_errors=errors)
        progress_total = sum(os.path.getsize(p) for p in paths)
    else:
        hf = dict(subset=hf_subset, split=hf_split, text_field=text_field,
                  max_documents=max_documents)
        settings.update(hf_name=hf_name, **{f"hf_{k}": v for k, v in hf.items()})

        def documents(bar=None):
            return iter_hf(hf_name, progress=bar, **hf)
        progress_total = None
    if (out / st.MANIFEST).exists():
        directory, manifest = st.load_manifest(out)
        _check_settings(out, manifest.get("settings"), settings)
        for rec in manifest["shards"]:
            st.open_shard(directory, rec, np.dtype(manifest["dtype"]), verify=True)
        print(f"token store {out} is complete ({manifest['documents']} documents, "
              f"{manifest['tokens']} tokens, {manifest['num_shards']} shards)", file=sys.stderr)
        return manifest
    out.mkdir(parents=True, exist_ok=True)
    if (out / st.SETTINGS).exists():
        _check_settings(out, st.read_json(out / st.SETTINGS, "settings"), settings)
    else:
        st.write_json(out / st.SETTINGS, settings)

    if (out / st.TOKENIZER).exists():  # a resumed run keeps the tokenizer it trained
        tok = toks.from_config(_absolute(st.read_json(out / st.TOKENIZER, "tokenizer"), out))
    else:
        tok = build_tokenizer(tokenizer, documents, out, vocab_size, tokenizer_dir)
        save_tokenizer(tok, out)
        tok = toks.from_config(_absolute(st.read_json(out / st.TOKENIZER, "tokenizer"), out))
    eod_id = int(tok.vocab_size)  # the id WithSpecials(tok, [EOD]) gives, as data.text
    dtype = st.token_dtype(eod_id + 1)

    records = finished_shards(out)
    skip = sum(r["documents"] for r in records)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=progress_total, unit="B" if progress_total else "doc",
                   unit_scale=True, desc=f"tokenizing into {out.name}", file=sys.stderr)
    written, docs, n_tokens, index = 0, [], 0, skip
    encode = getattr(tok, "encode_array", None) or (lambda t: np.asarray(tok.encode(t), np.int64))
    try:
        for i, doc in enumerate(documents(bar)):
            if i < skip:
                continue  # held by a finished shard: not tokenized again
            ids = encode(doc)
            if len(ids) and (ids.min() < 0 or ids.max() >= eod_id):
                raise ValueError(f"the tokenizer gave ids outside [0, {eod_id}) for document {i}")
            docs.append(ids.astype(dtype))  # the shard's type: half an int32 list's memory
            n_tokens += len(ids) + 1
            if n_tokens >= shard_tokens:
                if max_shards is not None and written >= max_shards:
                    return None
                records.append(st.write_shard(out, len(records), docs, eod_id, dtype, index))
                index += len(docs)
                written, docs, n_tokens = written + 1, [], 0
        if docs:
            if max_shards is not None and written >= max_shards:
                return None
            records.append(st.write_shard(out, len(records), docs, eod_id, dtype, index))
    finally:
        if bar is not None:
            bar.close()
    if not records:
        raise ValueError(f"no text found in {settings.get('files') or hf_name}")
    manifest = {"format": st.FORMAT, "version": st.VERSION, "settings": settings,
                "tokenizer": st.tokenizer_identity(tok), "eod_id": eod_id,
                "dtype": dtype.name, "num_shards": len(records),
                "documents": sum(r["documents"] for r in records),
                "tokens": sum(r["tokens"] for r in records), "shards": records}
    st.write_json(out / st.MANIFEST, manifest)
    for p in list(out.glob("shard_*.json")) + [out / st.SETTINGS]:
        p.unlink()  # the manifest holds them now
    print(f"wrote token store {out}: {manifest['documents']} documents, "
          f"{manifest['tokens']} tokens, {len(records)} shards", file=sys.stderr)
    return manifest


def _absolute(cfg: dict, out: pathlib.Path) -> dict:
    if cfg.get("kind") == "sentencepiece":
        return dict(cfg, model_file=str(out / cfg["model_file"]))
    return cfg


def _check_settings(out: pathlib.Path, old: dict | None, new: dict) -> None:
    if old != new:
        diff = sorted(k for k in set(old or {}) | set(new) if (old or {}).get(k) != new.get(k))
        raise st.StoreError(f"token store {out} was made with other settings ({', '.join(diff)} "
                            f"differ: {', '.join(f'{k}={(old or {}).get(k)!r}' for k in diff)}); "
                            "give the same arguments to finish it, or another --out")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", nargs="+", help="text files or globs")
    p.add_argument("--hf_name", help="a hub dataset (or a local folder of data files)")
    p.add_argument("--hf_subset", default=None)
    p.add_argument("--hf_split", default="train")
    p.add_argument("--text_field", default="text")
    p.add_argument("--max_documents", type=int, default=None)
    p.add_argument("--out", required=True, help="the store directory")
    p.add_argument("--tokenizer", default="byte",
                   help="byte | char | sentencepiece | a Hugging Face name or path")
    p.add_argument("--sample_by", default="document", choices=sources.SAMPLE_BY)
    p.add_argument("--shard_tokens", type=int, default=1 << 26)
    p.add_argument("--vocab_size", type=int, default=None, help="for sentencepiece")
    p.add_argument("--tokenizer_dir", default=None,
                   help="reuse a char_vocab.json / SentencePiece model found here")
    p.add_argument("--max_shards", type=int, default=None,
                   help="stop after this many new shards (as a kill would)")
    p.add_argument("--encoding_errors", default="strict", choices=sources.ENCODING_ERRORS,
                   help="invalid UTF-8: strict stops naming the file and line; replace "
                        "reads bad bytes as U+FFFD")
    p.add_argument("--no_progress", action="store_true")
    a = p.parse_args(argv)
    files = None if not a.files else a.files[0] if len(a.files) == 1 else a.files
    try:
        prepare(files, a.out, tokenizer=a.tokenizer, sample_by=a.sample_by,
                shard_tokens=a.shard_tokens, vocab_size=a.vocab_size,
                tokenizer_dir=a.tokenizer_dir, max_shards=a.max_shards,
                progress=not a.no_progress, hf_name=a.hf_name, hf_subset=a.hf_subset,
                hf_split=a.hf_split, text_field=a.text_field,
                max_documents=a.max_documents, encoding_errors=a.encoding_errors)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
