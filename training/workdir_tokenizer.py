"""The run's tokenizer, saved in its workdir: WORKDIR/tokenizer.json.

A workdir is self-contained: the mapping between text and ids that the model was trained
with travels with it, so evaluation and generation never rebuild it from a corpus (a char
vocabulary rebuilt from changed text would give other ids and a silently wrong loss).

Written when a run starts fresh (and by the first resume of a workdir from before this
file existed); checked when a run resumes: a dataset whose tokenizer differs (the text
of a char run now holds other characters, a store made with another tokenizer) stops the
run with one message naming the file. The JSON holds the tokenizer's `to_config()` (the
special ids after its vocabulary included) and its identity (kind, vocabulary size and a
sha256 of what defines the mapping, data.store.tokenizer_identity). A SentencePiece model
is copied beside it (tokenizer.model) and a fast Hugging Face tokenizer's JSON too
(tokenizer.hf.json), both referred to relatively, so the workdir works offline and
elsewhere.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

from data.store import write_atomic_bytes

FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
HF_FILE = "tokenizer.hf.json"


class TokenizerMismatch(ValueError):
    """The data's tokenizer is not the one saved with the run; the message names both."""


def path(workdir) -> pathlib.Path:
    return pathlib.Path(workdir) / FILE


def _split(tokenizer):
    from data import tokenizers as toks
    if isinstance(tokenizer, toks.WithSpecials):
        return tokenizer.base, list(tokenizer.specials)
    return tokenizer, []


def identity(tokenizer) -> dict:
    """What must agree for two tokenizers to map text to the same ids."""
    from data import store
    base, specials = _split(tokenizer)
    return {"base": store.tokenizer_identity(base), "specials": specials,
            "vocab_size": int(tokenizer.vocab_size)}


def describe(ident: dict) -> str:
    base = ident["base"]
    extra = f" + {len(ident['specials'])} special ids" if ident["specials"] else ""
    return f"{base['name']} (vocab {base['vocab_size']}{extra})"


def save(workdir, tokenizer) -> pathlib.Path:
    """Writes WORKDIR/tokenizer.json (and the model file it needs) atomically."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    base, specials = _split(tokenizer)
    cfg = base.to_config()
    if cfg["kind"] == "sentencepiece":
        src = pathlib.Path(cfg["model_file"])
        if src.resolve() != (workdir / SENTENCEPIECE_FILE).resolve():
            write_atomic_bytes(workdir / SENTENCEPIECE_FILE, src.read_bytes())
        cfg = dict(cfg, model_file=SENTENCEPIECE_FILE)
    elif cfg["kind"] == "hf" and getattr(base, "_fast", False):
        write_atomic_bytes(workdir / HF_FILE, base._tok.to_str().encode())
        cfg = dict(cfg, file=HF_FILE)
    record = {"tokenizer": cfg, "specials": specials, "identity": identity(tokenizer)}
    write_atomic_bytes(workdir / FILE, (json.dumps(record, indent=1) + "\n").encode())
    return workdir / FILE


def read(workdir) -> dict | None:
    """The saved record, or None for a workdir from before tokenizers were saved."""
    p = path(workdir)
    if not p.exists():
        return None
    try:
        record = json.loads(p.read_text())
        record["tokenizer"]["kind"], record["identity"]["base"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise TokenizerMismatch(f"{p} is damaged ({type(e).__name__}: {e}); it holds the "
                                "run's tokenizer: restore it from a copy of the workdir, or "
                                "delete it to rebuild the tokenizer from the data "
                                "(char vocabularies then depend on the text)") from None
    return record


def load(workdir):
    """The run's tokenizer (its special ids included), or None if none was saved."""
    from data import tokenizers as toks
    record = read(workdir)
    if record is None:
        return None
    workdir = pathlib.Path(workdir)
    cfg = dict(record["tokenizer"])
    if cfg["kind"] == "sentencepiece":
        cfg["model_file"] = str(workdir / cfg["model_file"])
    if cfg["kind"] == "hf" and cfg.get("file"):
        base = toks.HFTokenizer(str(workdir / cfg["file"]))
        base.name = cfg["name"]  # its identity is the hub name's
    else:
        base = toks.from_config(cfg)
    tok = toks.WithSpecials(base, record.get("specials", []))
    got = identity(tok)
    if got != record["identity"]:
        raise TokenizerMismatch(f"the tokenizer in {path(workdir)} ({describe(got)}) does "
                                f"not match the identity saved with it "
                                f"({describe(record['identity'])}): a file beside it "
                                f"({SENTENCEPIECE_FILE} / {HF_FILE}) changed")
    return tok


def check_or_save(workdir, tokenizer, *, resuming: bool, cfg_data=None,
                  write: bool = True) -> None:
    """At the start of a run: a fresh start saves the data's tokenizer (replacing any
    file a run that never saved a checkpoint left); a resume checks it against the saved
    one (saving it if the workdir has none). `write`: whether this process writes."""
    record = read(workdir) if resuming else None
    if record is None:
        if write:
            save(workdir, tokenizer)
        return
    want = record["identity"]
    got = identity(tokenizer)
    if got == want:
        return
    raise TokenizerMismatch(
        f"the data's tokenizer, {describe(got)}, is not the one this run was trained "
        f"with, {describe(want)}, saved in {path(workdir)}"
        + _char_difference(record, tokenizer, cfg_data)
        + ": restore the training data, or train in another --workdir")


def _char_difference(record: dict, tokenizer, cfg_data) -> str:
    """For char vocabularies: which characters differ, and where the first new one is."""
    base, _ = _split(tokenizer)
    if record["tokenizer"].get("kind") != "char" or getattr(base, "kind", None) != "char":
        return ""
    old, new = set(record["tokenizer"]["chars"]), set(base.chars)
    parts = []
    if new - old:
        parts.append(f"the text now has {len(new - old)} characters the run's "
                     f"vocabulary lacks ({_show(new - old)})")
        where = _first_char_outside(cfg_data, old)
        if where:
            parts[-1] += f", the first at {where}"
    if old - new:
        parts.append(f"lacks {len(old - new)} of the run's ({_show(old - new)})")
    return " (" + "; ".join(parts) + ")" if parts else ""


def _show(chars, n: int = 5) -> str:
    shown = ", ".join(repr(c) for c in sorted(chars)[:n])
    return shown + (", ..." if len(chars) > n else "")


def _first_char_outside(cfg_data, chars: set) -> str | None:
    from data import sources
    from data.base import cfg_get
    if cfg_data is None or cfg_get(cfg_data, "source", "files") != "files":
        return None
    try:
        paths = sources.resolve_files(cfg_get(cfg_data, "files"))
    except (ValueError, OSError):
        return None
    errors = cfg_get(cfg_data, "encoding_errors", "strict")
    for p in paths:
        found = first_unknown_char(p, chars, errors)
        if found:
            return found
    return None


def first_unknown_char(file_path: str, chars: set, encoding_errors: str = "strict",
                       text: str | None = None) -> str | None:
    """'FILE line N (character 'x')' for the first character of the file not in `chars`,
    or None."""
    from data import sources
    if text is None:
        text = sources.read_text(file_path, encoding_errors)
    for i, c in enumerate(text):
        if c not in chars:
            return f"{file_path} line {text.count(chr(10), 0, i) + 1} (character {c!r})"
    return None


def check_files_fit(tokenizer, paths: Sequence[str], where: Any,
                    encoding_errors: str = "strict") -> None:
    """Refuses text files that the run's tokenizer cannot encode (a char vocabulary and a
    character it lacks), naming the file, the line and the saved tokenizer `where`."""
    base, _ = _split(tokenizer)
    if getattr(base, "kind", None) != "char":
        return  # byte, SentencePiece (byte fallback) and HF tokenizers encode any text
    chars = set(base.chars)
    for p in paths:
        found = first_unknown_char(p, chars, encoding_errors)
        if found:
            raise TokenizerMismatch(
                f"{found} is not in this run's vocabulary ({where}, {len(chars)} "
                f"characters): the text does not fit the run; evaluate text made of the "
                f"run's characters, or train on this text")


class Vocabulary:
    """What evaluation needs of a dataset when it reads no corpus (generation, --files):
    the run's tokenizer and vocabulary size."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)


TEXT_SOURCES = ("files", "hf", "tfds")


def eval_dataset(config, workdir, *, data: bool = True):
    """The dataset evaluation uses: built with the run's saved tokenizer (text sources)
    or checked against it (the store, synthetic tasks); a Vocabulary when `data` is
    False. A workdir without tokenizer.json (an older run) builds it as training did."""
    from data import sources
    from data.base import cfg_get
    from training import builders

    saved = load(workdir)
    if saved is None:
        return builders.build_dataset(config)
    if not data:
        return Vocabulary(saved)
    cfg = config.data
    source = cfg_get(cfg, "source", "files")
    if source == "files":
        files = [cfg_get(cfg, "files")] + ([cfg_get(cfg, "val_split")]
                                           if cfg_get(cfg, "val_split") else [])
        paths = [p for f in files for p in sources.resolve_files(f)]
        check_files_fit(saved, paths, path(workdir), cfg_get(cfg, "encoding_errors", "strict"))
    dataset = builders.build_dataset(config, saved if source in TEXT_SOURCES else None)
    got, want = identity(dataset.tokenizer), identity(saved)
    if got != want:
        raise TokenizerMismatch(
            f"the data of this run's config ({source}) gives the tokenizer "
            f"{describe(got)}, not the one the run was trained with, {describe(want)} "
            f"(saved in {path(workdir)}): the data changed since training; restore it, or "
            f"evaluate other text with --files")
    return dataset
