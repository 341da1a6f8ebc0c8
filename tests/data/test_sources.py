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
    with pytest.raises(ValueError, match="'org/corpus'.*local directory"):
        sources.load_hf("org/corpus")


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
