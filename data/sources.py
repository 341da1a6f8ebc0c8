"""Text sources: local files, Hugging Face hub datasets, TFDS. Each returns a list of
documents (str), in a fixed order so the packed stream is reproducible.

- local files: `datasets.load_dataset("text", data_files=..., sample_by=...)` (works
  offline); plain reading only when `datasets` is not installed (the GPU machine).
- hub: `datasets.load_dataset(name, subset, split=..., streaming=True)`, first
  `max_documents` documents (HF_MAX_DOCUMENTS unless set; 0: all), field `text_field`.
- TFDS: `tfds.data_source(name, split=...)` (random access, no TensorFlow needed).
A source that stops short of its dataset says so in one line (`report`, stderr by
default): how many documents it used of how many, and the key that changes it.
"""
from __future__ import annotations

import glob
import itertools
import os
import pathlib
import sys
from typing import Callable, Sequence

SAMPLE_BY = ("document", "paragraph", "line")
# data.max_documents for source=hf when unset: a hub dataset is streamed into memory
# whole, so a web-scale one would never finish loading; the cut is reported, never silent.
HF_MAX_DOCUMENTS = 10_000


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def resolve_files(files: str | Sequence[str]) -> list[str]:
    """Expand a path, a glob, or a list of them; every one must match a file."""
    if files is None or (not isinstance(files, str) and len(files) == 0):
        raise ValueError("data.files is empty; set it to a text file path or glob, "
                         "e.g. --config.data.files=data/input.txt")
    patterns = [files] if isinstance(files, str) else list(files)
    out = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise FileNotFoundError(f"data.files pattern {pattern!r} matches no file")
            out.extend(matches)
        elif os.path.isdir(pattern):
            raise IsADirectoryError(f"data.files entry {pattern} is a directory; give a "
                                    f"file or a glob such as {os.path.join(pattern, '*.txt')}")
        elif not os.path.isfile(pattern):
            raise FileNotFoundError(f"data.files entry {pattern} does not exist")
        else:
            out.append(pattern)
    for path in out:
        if os.path.getsize(path) == 0:
            raise ValueError(f"text file {path} is empty; give a file with some text")
    return out


ENCODING_ERRORS = ("strict", "replace")


class TextDecodeError(ValueError):
    """A text file that is not valid UTF-8; the message names the file, line and byte."""


def _decode_error_message(path: str, offset: int, bad: bytes) -> str:
    line = 1 + _count_newlines(path, offset)
    return (f"text file {path} line {line} (byte {offset:,}) is not valid UTF-8 (bytes "
            f"{bad.hex(' ')}): fix or re-encode the file (e.g. iconv -f latin1 -t utf-8), "
            f"or set data.encoding_errors=replace to read bad bytes as U+FFFD")


def _count_newlines(path: str, end: int, chunk: int = 1 << 24) -> int:
    n = 0
    with open(path, "rb") as f:
        while end > 0:
            block = f.read(min(chunk, end))
            if not block:
                break
            n += block.count(b"\n")
            end -= len(block)
    return n


def find_decode_error(path: str, chunk: int = 1 << 24) -> str | None:
    """The TextDecodeError message for the first invalid UTF-8 in `path`, or None if it
    decodes; one streaming pass, a chunk in memory at a time."""
    import codecs
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pos = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                # e.start counts from the decoder's buffered tail plus this block.
                buffered = len(e.object) - len(block)
                offset = pos - buffered + e.start
                return _decode_error_message(path, offset, e.object[e.start:e.end])
            if not block:
                return None
            pos += len(block)


def check_encoding_errors(value: str | None) -> str:
    value = value or "strict"
    if value not in ENCODING_ERRORS:
        raise ValueError(f"data.encoding_errors={value!r}: use one of "
                         f"{', '.join(ENCODING_ERRORS)}")
    return value


def read_text(path: str, encoding_errors: str = "strict") -> str:
    """A file's text (universal newlines); invalid UTF-8 raises TextDecodeError naming
    the file and line, unless encoding_errors="replace"."""
    try:
        return pathlib.Path(path).read_text(encoding="utf-8", errors=encoding_errors)
    except UnicodeDecodeError:
        raise TextDecodeError(find_decode_error(path) or f"text file {path} is not valid "
                              "UTF-8") from None


def _is_decode_error(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, UnicodeDecodeError):
            return True
        e = e.__cause__ or e.__context__
    return False


def _split_plain(text: str, sample_by: str) -> list[str]:
    """The same units the `datasets` text builder yields, for the fallback reader."""
    if sample_by == "document":
        return [text]
    if sample_by == "paragraph":
        return [p for p in text.split("\n\n") if p]  # as datasets does
    return text.splitlines()


def load_files(files: str | Sequence[str], sample_by: str = "document",
               cache_dir: str | None = None, encoding_errors: str | None = None) -> list[str]:
    """Documents from local text files (one per file, paragraph or line). A file that is
    not valid UTF-8 raises TextDecodeError naming it and the line, unless
    encoding_errors="replace" (data.encoding_errors): bad bytes then read as U+FFFD."""
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"data.sample_by must be one of {SAMPLE_BY}, got {sample_by!r}")
    errors = check_encoding_errors(encoding_errors)
    paths = resolve_files(files)
    try:
        import datasets
    except ImportError:  # e.g. the GPU machine: read the files directly
        docs = []
        for path in paths:
            docs.extend(_split_plain(read_text(path, errors), sample_by))
    else:
        try:
            ds = datasets.load_dataset("text", data_files=paths, sample_by=sample_by,
                                       split="train", cache_dir=cache_dir,
                                       encoding_errors=errors)
        except Exception as e:
            if not _is_decode_error(e):
                raise
            # datasets says neither file nor line: find them (one pass over the files).
            for path in paths:
                message = find_decode_error(path)
                if message:
                    raise TextDecodeError(message) from None
            raise
        docs = list(ds["text"])
    docs = [d for d in docs if d]
    if not docs or not any(d.strip() for d in docs):
        raise ValueError(f"no text found in {paths}; the files hold only whitespace")
    return docs


def _text_of(example, text_field: str, where: str) -> str:
    if text_field not in example:
        raise KeyError(f"{where} has no field {text_field!r}; its fields are "
                       f"{sorted(example)}; set data.text_field")
    text = example[text_field]
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def _hf_num_examples(ds, split: str) -> int | None:
    """The split's document count from the dataset's metadata, if it states one."""
    try:
        return int(ds.info.splits[split].num_examples) or None
    except Exception:  # no info, no splits, or not this split: the count is unknown
        return None


def open_hf(name: str, *, subset: str | None, split: str, streaming: bool, asked_by: str,
            offline_hint: str):
    """`datasets.load_dataset` of a hub name or local directory, with the two failures a
    user meets named in one line: `datasets` not installed (`asked_by` says which option
    needs it) and a dataset that cannot be reached or read (`offline_hint` says what to
    do without a network)."""
    try:
        import datasets
    except ImportError:
        raise ImportError(f"{asked_by} needs the `datasets` package: pip install datasets") from None
    args = (name, subset) if subset else (name,)
    try:
        return datasets.load_dataset(*args, split=split, streaming=streaming)
    except (FileNotFoundError, ConnectionError, OSError, ValueError) as e:
        raise ValueError(
            f"could not load Hugging Face dataset {name!r} (subset {subset!r}, split "
            f"{split!r}): {type(e).__name__}: {e}. Offline, {offline_hint}") from e


def load_hf(name: str, *, split: str = "train", subset: str | None = None,
            text_field: str = "text", max_documents: int | None = HF_MAX_DOCUMENTS,
            streaming: bool = True,
            report: Callable[[str], None] = _to_stderr) -> list[str]:
    """The first `max_documents` documents (None or 0: all) of a Hugging Face dataset,
    streamed; when the dataset has more, one line to `report` says how many were used of
    how many."""
    if not name:
        raise ValueError("data.name must name the Hugging Face dataset for source='hf'")
    ds = open_hf(name, subset=subset, split=split, streaming=streaming, asked_by="source='hf'",
                 offline_hint="give a local directory of data files as data.name, or use "
                              "source='files'")
    rows = iter(ds)
    taken = list(itertools.islice(rows, max_documents)) if max_documents else list(rows)
    if max_documents and next(rows, None) is not None:
        total = _hf_num_examples(ds, split)
        of = f"{total:,}" if total else f"more than {max_documents:,}"
        report(f"data: dataset {name!r} split {split!r}: using the first "
               f"{max_documents:,} documents of {of} (data.max_documents; 0 reads all)")
    docs = [_text_of(ex, text_field, f"dataset {name!r}") for ex in taken]
    docs = [d for d in docs if d]
    if not docs:
        raise ValueError(f"dataset {name!r} split {split!r} gave no text in field {text_field!r}")
    return docs


def load_tfds(name: str, *, split: str = "train", text_field: str = "text",
              max_documents: int | None = None, data_dir: str | None = None,
              report: Callable[[str], None] = _to_stderr) -> list[str]:
    """Documents of a prepared TFDS dataset through `tfds.data_source` (no TensorFlow):
    all, or the first `max_documents` (said in one line to `report` when that cuts)."""
    if not name:
        raise ValueError("data.name must name the TFDS dataset for source='tfds'")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("source='tfds' needs tensorflow-datasets: pip install "
                          "tensorflow-datasets (TensorFlow itself is not needed)") from None
    src = tfds.data_source(name, split=split, data_dir=data_dir)
    n = len(src) if not max_documents else min(len(src), int(max_documents))
    if n < len(src):
        report(f"data: TFDS dataset {name!r} split {split!r}: using the first {n:,} "
               f"documents of {len(src):,} (data.max_documents; 0 reads all)")
    docs = [_text_of(src[i], text_field, f"TFDS dataset {name!r}") for i in range(n)]
    docs = [d for d in docs if d]
    if not docs:
        raise ValueError(f"TFDS dataset {name!r} split {split!r} gave no text in field {text_field!r}")
    return docs
