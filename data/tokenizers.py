"""Text tokenizers with one interface, and the special ids datasets add on top.

Every tokenizer has `encode(str) -> list[int]`, `decode(list[int]) -> str`,
`vocab_size`, and `to_config() -> dict`; `from_config(d)` rebuilds the same tokenizer
(that is how `eval` recovers it from a workdir). Kinds:

- `byte`: UTF-8 bytes, vocab 256 (the default; needs no training).
- `char`: the sorted set of characters of the training text (nanoGPT's
  tiny-Shakespeare vocab is 65). The character list travels inside `to_config()` and
  is also written to `<tokenizer_dir>/char_vocab.json` when a directory is given.
- `sentencepiece`: trained locally on the corpus, model file under `tokenizer_dir`.
- any other name: a Hugging Face tokenizer (`tokenizers` or `transformers`, imported
  lazily), e.g. `gpt2` or a local directory holding `tokenizer.json`.

`WithSpecials` appends named special ids ("<|eod|>", "[NEEDLE]", ...) after a base
tokenizer's vocabulary, so datasets can reserve ids without touching the tokenizer.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Iterable, Sequence

import numpy as np

_BUILTIN = ("byte", "char", "sentencepiece")


class ByteTokenizer:
    """UTF-8 bytes: ids 0..255; decoding replaces invalid byte sequences."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def to_config(self) -> dict:
        return {"kind": "byte"}


class CharTokenizer:
    """One id per distinct character of the training text, in sorted order (nanoGPT)."""

    kind = "char"

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer needs a list of distinct single characters")
        self.chars = chars
        self._stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        if not text:
            raise ValueError("cannot build a char vocabulary from empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(
                f"character {e.args[0]!r} is not in the char vocabulary built from the "
                "training text; use tokenizer='byte' for open-vocabulary text") from None

    def encode_array(self, text: str) -> np.ndarray:
        # Vectorised: code points looked up in the sorted code points of the vocabulary.
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        table = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        order = np.argsort(table)
        idx = np.clip(np.searchsorted(table[order], codes), 0, len(table) - 1)
        ids = order[idx]
        bad = table[ids] != codes
        if bad.any():
            self.encode(chr(int(codes[np.argmax(bad)])))  # raises the clear error
        return ids.astype(np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_config(self) -> dict:
        return {"kind": "char", "chars": "".join(self.chars)}

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        path = pathlib.Path(directory) / "char_vocab.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"chars": "".join(self.chars)}))
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "CharTokenizer":
        path = pathlib.Path(directory) / "char_vocab.json"
        return cls(list(json.loads(path.read_text())["chars"]))


class SentencePieceTokenizer:
    """A SentencePiece model (trained by `train`, or loaded from a .model file)."""

    kind = "sentencepiece"

    def __init__(self, model_file: str | os.PathLike):
        import sentencepiece as spm  # lazy: only this tokenizer needs it

        self.model_file = str(model_file)
        if not os.path.exists(self.model_file):
            raise FileNotFoundError(
                f"SentencePiece model {self.model_file} not found; train it with "
                "tokenizer='sentencepiece' on the training corpus first")
        self._sp = spm.SentencePieceProcessor(model_file=self.model_file)

    @classmethod
    def train(cls, texts: Iterable[str], directory: str | os.PathLike, vocab_size: int,
              model_type: str = "unigram") -> "SentencePieceTokenizer":
        import sentencepiece as spm

        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        prefix = directory / f"spm_{model_type}_{vocab_size}"
        # Train from an in-memory iterator of lines; the trainer wants sentences, so
        # documents are split on newlines (long lines are skipped by SentencePiece).
        lines = [ln for t in texts for ln in t.splitlines() if ln.strip()]
        if not lines:
            raise ValueError("cannot train SentencePiece on an empty corpus")
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=vocab_size,
                model_type=model_type, character_coverage=1.0,
                # byte fallback: unseen characters become their UTF-8 bytes (256 pieces),
                # so every string round-trips.
                byte_fallback=True,
                # no BOS/EOS/PAD: datasets add their own end-of-document id.
                bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
                normalization_rule_name="identity", remove_extra_whitespaces=False,
                split_digits=True, allow_whitespace_only_pieces=True,
                num_threads=2, minloglevel=2)
        except RuntimeError as e:
            raise ValueError(
                f"SentencePiece training with data.vocab_size={vocab_size} failed: {e}. "
                "The vocabulary needs 256 byte pieces plus the corpus's distinct "
                "characters, and no more pieces than the corpus can fill") from e
        return cls(f"{prefix}.model")

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self._sp.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def to_config(self) -> dict:
        return {"kind": "sentencepiece", "model_file": self.model_file}


class HFTokenizer:
    """A Hugging Face tokenizer by hub name or local path, imported lazily."""

    kind = "hf"

    def __init__(self, name: str):
        self.name = name
        self._tok = None
        errors = []
        try:
            import tokenizers  # the light package: a Rust tokenizer, no torch

            path = pathlib.Path(name)
            if path.is_dir() and (path / "tokenizer.json").exists():
                self._tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
            elif path.is_file():
                self._tok = tokenizers.Tokenizer.from_file(str(path))
            else:
                self._tok = tokenizers.Tokenizer.from_pretrained(name)
            self._fast = True
        except ImportError as e:
            errors.append(f"tokenizers: {e}")
        except Exception as e:  # offline, unknown name, ...
            errors.append(f"tokenizers: {type(e).__name__}: {e}")
        if self._tok is None:
            try:
                import transformers

                self._tok = transformers.AutoTokenizer.from_pretrained(name)
                self._fast = False
            except ImportError as e:
                errors.append(f"transformers: {e}")
            except Exception as e:
                errors.append(f"transformers: {type(e).__name__}: {e}")
        if self._tok is None:
            raise ValueError(
                f"could not load Hugging Face tokenizer {name!r} ({'; '.join(errors)}). "
                "Install `tokenizers` (pip install tokenizers), pass a local directory "
                "with tokenizer.json when offline (HF_HUB_OFFLINE=1 skips the network "
                "retries), or use tokenizer='byte', 'char' or 'sentencepiece'.")

    @property
    def vocab_size(self) -> int:
        if self._fast:
            return int(self._tok.get_vocab_size(with_added_tokens=True))
        return int(len(self._tok))

    def encode(self, text: str) -> list[int]:
        if self._fast:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def to_config(self) -> dict:
        return {"kind": "hf", "name": self.name}


class IntegerTokenizer:
    """For synthetic tasks whose tokens are bare ids: text is whitespace-separated ints."""

    kind = "integer"

    def __init__(self, vocab_size: int):
        self.vocab_size = int(vocab_size)

    def encode(self, text: str) -> list[int]:
        try:
            ids = [int(t) for t in text.split()]
        except ValueError:
            raise ValueError(
                f"{text[:40]!r} is not a list of token ids: this run's tokens are bare "
                f"integer ids in [0, {self.vocab_size}) (a synthetic task such as MQAR), "
                f"so give them separated by spaces, e.g. '3 17 5'") from None
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} are outside [0, {self.vocab_size})")
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(str(int(i)) for i in ids)

    def to_config(self) -> dict:
        return {"kind": "integer", "vocab_size": self.vocab_size}


class WithSpecials:
    """A base tokenizer plus named special ids appended after its vocabulary.

    `encode` is the base tokenizer's (specials never come from text); `decode`
    renders a special id by its name, e.g. "<|eod|>".
    """

    def __init__(self, base, specials: Sequence[str] = ()):
        if len(set(specials)) != len(specials):
            seen, dup = set(), []
            for name in specials:
                (dup.append(name) if name in seen else seen.add(name))
            raise ValueError(f"duplicate special token names: {dup[:5]}")
        self.base = base
        self.specials = list(specials)
        self._ids = {name: base.vocab_size + i for i, name in enumerate(self.specials)}

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size + len(self.specials)

    @property
    def kind(self) -> str:
        return self.base.kind

    def id_of(self, name: str) -> int:
        if name not in self._ids:
            raise KeyError(f"no special token {name!r}; have {self.specials}")
        return self._ids[name]

    def has(self, name: str) -> bool:
        return name in self._ids

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        if hasattr(self.base, "encode_array"):
            return self.base.encode_array(text)
        return np.asarray(self.base.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int], skip_specials: bool = False) -> str:
        """Text of `ids`; special ids appear by name unless `skip_specials` (e.g. to
        count the bytes of the text alone)."""
        out, run, n = [], [], self.base.vocab_size
        for i in ids:
            i = int(i)
            if i < n:
                run.append(i)
                continue
            if run:
                out.append(self.base.decode(run))
                run = []
            if skip_specials:
                continue
            k = i - n
            out.append(self.specials[k] if k < len(self.specials) else f"<|id{i}|>")
        if run:
            out.append(self.base.decode(run))
        return "".join(out)

    def extend(self, more: Sequence[str]) -> "WithSpecials":
        """The same base with further specials appended after the existing ones."""
        return WithSpecials(self.base, self.specials + [m for m in more])

    def to_config(self) -> dict:
        return {"kind": "with_specials", "base": self.base.to_config(),
                "specials": list(self.specials)}


def from_config(cfg: dict):
    """Rebuild a tokenizer from its `to_config()` dict."""
    kind = cfg.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(list(cfg["chars"]))
    if kind == "sentencepiece":
        return SentencePieceTokenizer(cfg["model_file"])
    if kind == "hf":
        return HFTokenizer(cfg["name"])
    if kind == "integer":
        return IntegerTokenizer(cfg["vocab_size"])
    if kind == "with_specials":
        return WithSpecials(from_config(cfg["base"]), cfg["specials"])
    raise ValueError(f"unknown tokenizer kind {kind!r} in {cfg}")


def build(name: str, texts: Sequence[str] | None = None, *,
          tokenizer_dir: str | os.PathLike | None = None, vocab_size: int | None = None):
    """The tokenizer called `name`, trained on `texts` where it needs training.

    `char` and `sentencepiece` reuse what an earlier run saved in `tokenizer_dir`, so a
    rebuilt dataset (eval, resume) maps text exactly as the training run did.
    """
    name = name or "byte"
    if name == "byte":
        return ByteTokenizer()
    if name == "char":
        if tokenizer_dir and (pathlib.Path(tokenizer_dir) / "char_vocab.json").exists():
            return CharTokenizer.load(tokenizer_dir)
        if texts is None:
            raise ValueError("tokenizer='char' needs the training text to build its vocabulary")
        tok = CharTokenizer.from_text("".join(texts))
        if tokenizer_dir:
            tok.save(tokenizer_dir)
        return tok
    if name == "sentencepiece":
        if not tokenizer_dir:
            raise ValueError("tokenizer='sentencepiece' needs data.tokenizer_dir (where "
                             "the trained model file is written), e.g. the workdir")
        if not vocab_size:
            raise ValueError("tokenizer='sentencepiece' needs data.vocab_size")
        model = pathlib.Path(tokenizer_dir) / f"spm_unigram_{int(vocab_size)}.model"
        if model.exists():
            return SentencePieceTokenizer(model)
        if texts is None:
            raise ValueError("tokenizer='sentencepiece' needs the training text to train on")
        return SentencePieceTokenizer.train(texts, tokenizer_dir, int(vocab_size))
    return HFTokenizer(name)
