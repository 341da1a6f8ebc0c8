"""Hub, TFDS and SentencePiece paths, on small local data (no network)."""
import json

import numpy as np
import pytest

import data
from data import sources, tokenizers


def test_hf_streaming_from_a_local_dataset_directory(tmp_path):
    pytest.importorskip("datasets")
    rows = [{"content": f"document number {i}\n" * 3, "id": i} for i in range(30)]
    with open(tmp_path / "train.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    docs = sources.load_hf(str(tmp_path), text_field="content", max_documents=12)
    assert docs == [r["content"] for r in rows[:12]]  # the first N, in order
    ds = data.build({"source": "hf", "name": str(tmp_path), "text_field": "content",
                     "max_documents": 12, "seq_len": 16, "packing": "rows",
                     "val_fraction": 0.25}, seed=0)
    expected = b"".join(r["content"].encode() + b"\x00" for r in rows[:12])
    stream = np.concatenate([ds.train_tokens, ds.val_tokens])
    np.testing.assert_array_equal(np.where(stream == 256, 0, stream),
                                  np.frombuffer(expected, np.uint8))
    with pytest.raises(KeyError, match="'text'.*content"):
        sources.load_hf(str(tmp_path), max_documents=2)


def test_hf_passes_name_subset_split_and_streams(monkeypatch):
    datasets = pytest.importorskip("datasets")

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return iter([{"text": "a"}, {"text": "b"}, {"text": "c"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    docs = sources.load_hf("org/corpus", subset="en", split="validation", max_documents=2)
    assert docs == ["a", "b"]
    assert calls == [(("org/corpus", "en"), {"split": "validation", "streaming": True})]


def test_hf_load_failure_names_the_dataset(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match="'org/corpus'.*local directory of data files as "
                                         "data.name"):
        sources.load_hf("org/corpus")
    # the store builder's streaming reader names its own option
    from data import prepare
    with pytest.raises(ValueError, match="'org/corpus'.*local directory of data files as "
                                         "--hf_name"):
        next(prepare.iter_hf("org/corpus", subset=None, split="train", text_field="text",
                             max_documents=None))


def test_hf_without_datasets_names_the_option_that_needs_it(monkeypatch):
    import sys

    from data import prepare
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ImportError, match="source='hf' needs the `datasets` package"):
        sources.load_hf("org/corpus")
    with pytest.raises(ImportError, match="--hf_name needs the `datasets` package"):
        next(prepare.iter_hf("org/corpus", subset=None, split="train", text_field="text",
                             max_documents=None))


def test_tfds_data_source_under_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        reference = [ex["text"] for ex in tfds.data_source("tiny_shakespeare", split="train")]
        reference = [t.decode() if isinstance(t, bytes) else t for t in reference]
        ds = data.build({"source": "tfds", "name": "tiny_shakespeare", "seq_len": 8,
                         "packing": "rows", "val_fraction": 0.0}, seed=0)
    assert len(reference) == 6
    expected = b"".join(t.encode() + b"\x00" for t in reference)
    np.testing.assert_array_equal(np.where(ds.train_tokens == 256, 0, ds.train_tokens),
                                  np.frombuffer(expected, np.uint8))
    assert ds.num_documents == 6


def test_sentencepiece_trains_locally_and_round_trips(tmp_path):
    pytest.importorskip("sentencepiece")
    words = ["linear", "attention", "state", "recall", "needle", "haystack", "token",
             "kernel", "chunk", "delta", "rule", "gate"]
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, size=8)) + f". {i}" for i in range(600)]
    f = tmp_path / "corpus.txt"
    f.write_text("\n".join(lines) + "\n")
    cfg = {"source": "files", "files": str(f), "tokenizer": "sentencepiece",
           "vocab_size": 290, "tokenizer_dir": str(tmp_path / "tok"), "seq_len": 32}
    ds = data.build(cfg, seed=0)
    tok = ds.tokenizer
    assert tok.base.vocab_size == 290 and ds.vocab_size == 290  # one document: no EOD
    s = "linear attention recall, with a needle in the haystack!\n  Ünïcödé 🙂"
    assert tok.decode(tok.encode(s)) == s  # byte fallback covers unseen characters
    assert len(tok.encode("gate linear rule")) == 3  # whole-word pieces were learned
    # eval rebuilds the same tokenizer: from the saved model file, or from to_config()
    again = data.build(cfg, seed=0).tokenizer
    assert again.base.model_file == tok.base.model_file
    rebuilt = tokenizers.from_config(tok.to_config())
    assert rebuilt.encode(s) == tok.encode(s)
    np.testing.assert_array_equal(ds.train_tokens[:50], tok.encode(f.read_text()[:400])[:50])


def test_sentencepiece_needs_a_directory(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("some text\n" * 50)
    with pytest.raises(ValueError, match="tokenizer_dir"):
        data.build({"source": "files", "files": str(f), "tokenizer": "sentencepiece",
                    "vocab_size": 50}, seed=0)


# --------------------------------------------------------------------- no silent caps
def _jsonl_dataset(directory, n):
    rows = [{"text": f"document {i}\n"} for i in range(n)]
    with open(directory / "train.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return [r["text"] for r in rows]


def test_hf_cap_is_said_in_one_line_and_zero_takes_all(tmp_path):
    pytest.importorskip("datasets")
    texts = _jsonl_dataset(tmp_path, 30)
    said = []
    docs = sources.load_hf(str(tmp_path), max_documents=12, report=said.append)
    assert docs == texts[:12] and len(said) == 1
    assert f"dataset {str(tmp_path)!r} split 'train': using the first 12 documents of" \
        in said[0] and "data.max_documents; 0 reads all" in said[0]
    said.clear()
    assert sources.load_hf(str(tmp_path), max_documents=0, report=said.append) == texts
    assert sources.load_hf(str(tmp_path), max_documents=30, report=said.append) == texts
    assert said == []  # nothing was cut


def test_hf_default_cap_through_data_build_goes_to_stderr(tmp_path, monkeypatch, capsys):
    pytest.importorskip("datasets")
    texts = _jsonl_dataset(tmp_path, 30)
    monkeypatch.setattr(sources, "HF_MAX_DOCUMENTS", 20)  # the unset-key default
    ds = data.build({"source": "hf", "name": str(tmp_path), "seq_len": 8,
                     "packing": "rows", "val_fraction": 0.25}, seed=0)
    assert ds.num_documents == 20
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "using the first 20 documents of" in err[0]
    ds = data.build({"source": "hf", "name": str(tmp_path), "seq_len": 8,
                     "packing": "rows", "val_fraction": 0.25, "max_documents": 0}, seed=0)
    assert ds.num_documents == len(texts) and capsys.readouterr().err == ""


def test_hf_cap_names_the_total_when_the_dataset_states_it(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import types

    class Streamed:  # what streaming load_dataset returns: iterable, with info
        info = types.SimpleNamespace(
            splits={"train": types.SimpleNamespace(num_examples=25_000)})

        def __iter__(self):
            return iter({"text": f"doc {i}"} for i in range(25_000))

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: Streamed())
    said = []
    docs = sources.load_hf("org/corpus", max_documents=10_000, report=said.append)
    assert len(docs) == 10_000
    assert said == ["data: dataset 'org/corpus' split 'train': using the first 10,000 "
                    "documents of 25,000 (data.max_documents; 0 reads all)"]


def test_tfds_cut_is_said(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    said = []
    with tfds.testing.mock_data(num_examples=6):
        docs = sources.load_tfds("tiny_shakespeare", max_documents=4, report=said.append)
    assert len(docs) == 4 and said == [
        "data: TFDS dataset 'tiny_shakespeare' split 'train': using the first 4 documents "
        "of 6 (data.max_documents; 0 reads all)"]


# ------------------------------------------------------------- Hugging Face tokenizers
def test_requirements_install_what_the_documented_tokenizers_import():
    """data.tokenizer=sentencepiece and =<a Hugging Face name> import these lazily
    (data/tokenizers.py); a fresh `pip install -r requirements.txt` must bring them."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2]
    names = {re.split(r"[<>=!~\[ ]", line.strip())[0].lower()
             for line in (root / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert {"sentencepiece", "tokenizers"} <= names
    source = (root / "data" / "tokenizers.py").read_text()
    assert "import sentencepiece" in source and "import tokenizers" in source


def test_hf_tokenizer_from_a_local_tokenizer_json(tmp_path):
    hf = pytest.importorskip("tokenizers")
    text = "the state of linear attention is a matrix\n" * 40
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    tok = hf.Tokenizer(hf.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = hf.pre_tokenizers.Whitespace()
    tok.train([str(corpus)], hf.trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    ds = data.build({"source": "files", "files": str(corpus), "seq_len": 8,
                     "tokenizer": str(tmp_path / "tokenizer.json")}, seed=0)
    words = "linear attention is a matrix".split()
    ids = ds.tokenizer.encode("linear attention is a matrix")
    assert [tok.id_to_token(i) for i in ids] == words
    assert ds.tokenizer.base.vocab_size == tok.get_vocab_size() == 9  # 8 words + [UNK]
    assert set(np.unique(ds.train_tokens)) <= set(range(ds.vocab_size))


def test_hf_tokenizer_without_its_package_names_it(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tokenizers", None)    # as if not installed
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match=r"'gpt2'.*pip install tokenizers"):
        tokenizers.HFTokenizer("gpt2")
