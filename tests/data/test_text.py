"""Text sources, tokenizers on files, packing, held-out split and order."""
import numpy as np
import pytest

import data
from data import packing, tokenizers
from tests.conftest import SHAKESPEARE


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


# ---------------------------------------------------------------- tokenizers

@pytest.mark.skipif(not SHAKESPEARE.exists(), reason="shared tiny-Shakespeare absent")
def test_char_tiny_shakespeare_matches_nanogpt(tmp_path):
    text = SHAKESPEARE.read_text(encoding="utf-8")
    ds = data.build({"source": "files", "files": str(SHAKESPEARE), "tokenizer": "char",
                     "seq_len": 256, "tokenizer_dir": str(tmp_path)}, seed=0)
    assert ds.vocab_size == 65  # nanoGPT's vocab: a single document needs no EOD
    assert ds.tokenizer.decode(ds.tokenizer.encode("First Citizen:")) == "First Citizen:"
    # nanoGPT: the first 90% of the characters train, the last 10% are held out
    n = len(text)
    assert len(ds.train_tokens) == int(n * 0.9) and len(ds.val_tokens) == n - int(n * 0.9)
    assert ds.tokenizer.decode(ds.train_tokens[:1000]) == text[:1000]
    assert ds.tokenizer.decode(ds.val_tokens) == text[int(n * 0.9):]
    # the vocabulary is saved and reused by a rebuild (what eval does)
    saved = tokenizers.CharTokenizer.load(tmp_path)
    assert saved.chars == sorted(set(text)) and saved.chars[0] == "\n"


def test_byte_round_trips_unicode():
    tok = tokenizers.ByteTokenizer()
    s = "héllo wörld — 日本語 🙂\n"
    ids = tok.encode(s)
    assert len(ids) == len(s.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == s
    np.testing.assert_array_equal(tok.encode_array(s), ids)


def test_char_vectorised_encode_matches_loop_and_names_unknown_chars():
    tok = tokenizers.CharTokenizer.from_text("bca\nzé")
    assert tok.chars == ["\n", "a", "b", "c", "z", "é"]
    s = "abcé\nzz"
    np.testing.assert_array_equal(tok.encode_array(s), [tok.chars.index(c) for c in s])
    with pytest.raises(ValueError, match="'Q'"):
        tok.encode_array("abQ")


def test_tokenizer_configs_rebuild_the_same_tokenizer():
    base = tokenizers.CharTokenizer.from_text("hello there")
    tok = tokenizers.WithSpecials(base, ["<|eod|>"])
    again = tokenizers.from_config(tok.to_config())
    assert again.vocab_size == tok.vocab_size == base.vocab_size + 1
    ids = tok.encode("hello") + [tok.id_of("<|eod|>")] + tok.encode("there")
    assert again.decode(ids) == "hello<|eod|>there"


def test_hf_tokenizer_missing_packages_error_is_clear(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="Hugging Face tokenizer 'gpt2'.*pip install tokenizers"):
        tokenizers.HFTokenizer("gpt2")


def test_hf_tokenizer_from_a_local_tokenizer_json(tmp_path):
    hf = pytest.importorskip("tokenizers")
    tok = hf.Tokenizer(hf.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"],
                                     initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the state of the linear attention layer"] * 50
    tok.train_from_iterator(corpus, trainer)
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    f = write(tmp_path, "c.txt", "the linear state " * 40)
    ds = data.build({"source": "files", "files": f, "tokenizer": str(tmp_path / "tok"),
                     "seq_len": 8}, seed=0)
    t = ds.tokenizer
    assert t.base.vocab_size == tok.get_vocab_size() and t.kind == "hf"
    s = "the linear attention state"
    assert t.encode(s) == tok.encode(s).ids and t.decode(t.encode(s)) == s
    assert len(t.encode(s)) < len(s) / 2
    assert tokenizers.from_config(t.to_config()).encode(s) == t.encode(s)


# ---------------------------------------------------------------- files source

def test_missing_file_error_names_the_path(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        data.build({"source": "files", "files": missing}, seed=0)
    with pytest.raises(FileNotFoundError, match=r"\*\.md"):
        data.build({"source": "files", "files": str(tmp_path / "*.md")}, seed=0)


def test_empty_file_error_names_the_path(tmp_path):
    empty = write(tmp_path, "empty.txt", "")
    with pytest.raises(ValueError, match="empty.txt"):
        data.build({"source": "files", "files": empty}, seed=0)


def test_unknown_source_lists_valid_ones():
    with pytest.raises(ValueError, match="files, hf, tfds, store, mqar, niah, mixture"):
        data.build({"source": "csv"}, seed=0)


def test_files_glob_reads_every_document_in_order(tmp_path):
    write(tmp_path, "b.txt", "second doc\n")
    write(tmp_path, "a.txt", "first doc\n")
    ds = data.build({"source": "files", "files": str(tmp_path / "*.txt"), "seq_len": 4,
                     "packing": "rows", "val_fraction": 0.0}, seed=0)
    eod = ds.tokenizer.id_of("<|eod|>")
    assert eod == 256 and ds.vocab_size == 257
    expected = list(b"first doc\n") + [eod] + list(b"second doc\n") + [eod]
    np.testing.assert_array_equal(ds.train_tokens, expected)


def test_paragraph_sampling_splits_documents(tmp_path):
    f = write(tmp_path, "t.txt", "para one\nline\n\npara two\n\npara three")
    ds = data.build({"source": "files", "files": f, "sample_by": "paragraph",
                     "seq_len": 4, "val_fraction": 0.0}, seed=0)
    assert ds.num_documents == 3
    assert ds.tokenizer.decode(ds.train_tokens).split("<|eod|>") == \
        ["para one\nline", "para two", "para three"]


# ---------------------------------------------------------------- packing

def reference_segments(row, eod):
    """Segment ids by walking the row: an EOD (not at position 0) opens a new one."""
    seg, out = 1, []
    for t, tok in enumerate(row):
        if tok == eod and t > 0:
            seg += 1
        out.append(seg)
    return out


def test_rows_packing_segments_and_targets(tmp_path):
    docs = ["alpha beta", "gamma", "delta epsilon zeta", "eta theta", "iota"]
    paths = [write(tmp_path, f"d{i}.txt", d) for i, d in enumerate(docs)]
    ds = data.build({"source": "files", "files": paths, "seq_len": 8, "packing": "rows",
                     "val_fraction": 0.0}, seed=1)
    eod = ds.eod_id
    stream = ds.train_tokens
    assert (stream == eod).sum() == len(docs) and stream[-1] == eod
    n_rows = packing.num_full_rows(len(stream), 8)
    b = ds.batch(0, n_rows)  # one epoch: every row exactly once
    starts = []
    for i in range(n_rows):
        x, y, seg = b["inputs"][i], b["targets"][i], b["segment_ids"][i]
        s = next(s for s in range(0, len(stream) - 8, 8) if np.array_equal(stream[s:s + 8], x))
        starts.append(s)
        np.testing.assert_array_equal(y, stream[s + 1:s + 9])  # next tokens
        assert seg.tolist() == reference_segments(x.tolist(), eod)
        # the last token of a document predicts EOD inside its own segment
        for t in np.nonzero(y == eod)[0]:
            if t + 1 < 8:
                assert seg[t + 1] == seg[t] + 1
    assert sorted(starts) == list(range(0, n_rows * 8, 8))
    assert (b["mask"] == 1).all()


def test_segments_never_span_a_document():
    row = np.array([[5, 6, 9, 7, 9, 9, 8]])
    seg = packing.segment_ids(row, eod_id=9)
    np.testing.assert_array_equal(seg, [[1, 1, 2, 2, 3, 4, 4]])
    # tokens sharing a segment id come from one document (EODs open segments)
    np.testing.assert_array_equal(packing.segment_ids(np.array([[9, 1, 2]]), 9), [[1, 1, 1]])


def test_held_out_split_is_disjoint_and_complete(tmp_path):
    text = "".join(f"line {i} of the corpus\n" for i in range(300))
    f = write(tmp_path, "c.txt", text)
    ds = data.build({"source": "files", "files": f, "seq_len": 16, "val_fraction": 0.2}, seed=0)
    full = np.frombuffer(text.encode(), np.uint8)
    cut = int(len(full) * 0.8)
    np.testing.assert_array_equal(ds.train_tokens, full[:cut])
    np.testing.assert_array_equal(ds.val_tokens, full[cut:])
    # train windows come only from the train stream; eval covers val exactly once
    b = ds.batch(0, 64)
    train_text = text.encode()[:cut]
    for row in b["inputs"]:
        assert bytes(row.astype(np.uint8)) in train_text
    ev = list(ds.eval_batches(4))
    toks = np.concatenate([e["targets"][e["mask"] > 0] for e in ev])
    np.testing.assert_array_equal(toks, full[cut + 1:])
    assert all(e["inputs"].shape == (4, 16) for e in ev)
    pad = ev[-1]["mask"] == 0
    assert (ev[-1]["segment_ids"][pad] == 0).all()


def test_seq_len_longer_than_text_is_a_clear_error(tmp_path):
    f = write(tmp_path, "s.txt", "tiny")
    with pytest.raises(ValueError, match="seq_len"):
        data.build({"source": "files", "files": f, "seq_len": 64}, seed=0)


# ---------------------------------------------------------------- order

def test_batch_is_a_pure_function_of_seed_and_step(tmp_path):
    f = write(tmp_path, "o.txt", "abcdefghij" * 200)
    for mode in ("random_windows", "rows"):
        cfg = {"source": "files", "files": f, "seq_len": 32, "packing": mode}
        a, b = data.build(cfg, seed=5), data.build(cfg, seed=5)
        first = a.batch(11, 8)
        a.batch(3, 8)  # other calls in between change nothing
        for k in data.BATCH_KEYS:
            np.testing.assert_array_equal(first[k], a.batch(11, 8)[k])
            np.testing.assert_array_equal(first[k], b.batch(11, 8)[k])
        starts = {tuple(r) for r in first["inputs"][:, :3]}
        other = {tuple(r) for r in a.batch(12, 8)["inputs"][:, :3]}
        assert starts != other
        assert not np.array_equal(data.build(cfg, seed=6).batch(11, 8)["inputs"], first["inputs"])


def test_random_windows_are_nanogpt_windows(tmp_path):
    text = "".join(chr(97 + i % 26) for i in range(5000))
    f = write(tmp_path, "w.txt", text)
    ds = data.build({"source": "files", "files": f, "seq_len": 20, "tokenizer": "char"}, seed=9)
    b = ds.batch(4, 6)
    starts = np.random.default_rng([9, 4]).integers(0, len(ds.train_tokens) - 20, size=6)
    for i, s in enumerate(starts):
        np.testing.assert_array_equal(b["inputs"][i], ds.train_tokens[s:s + 20])
        np.testing.assert_array_equal(b["targets"][i], ds.train_tokens[s + 1:s + 21])
    assert (b["segment_ids"] == 1).all()


# ---------------------------------------------------------------- environment

def test_plain_reading_matches_datasets_when_datasets_is_absent(tmp_path, monkeypatch):
    import sys

    pytest.importorskip("datasets")
    text = "one\ntwo\n\nthree é\n\n\nfour\n" * 5
    f = write(tmp_path, "p.txt", text)
    modes = ("document", "paragraph", "line")
    with_hf = [data.sources.load_files(f, mode) for mode in modes]
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    plain = [data.sources.load_files(f, mode) for mode in modes]
    assert plain == with_hf


def test_data_imports_neither_jax_nor_optional_packages():
    import subprocess
    import sys

    code = ("import sys; import data, data.text, data.mqar, data.niah, data.mixture, "
            "data.tokenizers, data.sources; "
            "bad = [m for m in ('jax', 'datasets', 'tensorflow_datasets', 'sentencepiece', "
            "'ml_collections') if m in sys.modules]; assert not bad, bad")
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True)


def test_config_dict_with_placeholders_is_accepted(tmp_path):
    ml_collections = pytest.importorskip("ml_collections")
    from ml_collections import config_dict

    f = write(tmp_path, "c.txt", "abc " * 100)
    cfg = ml_collections.ConfigDict({"source": "files", "files": f, "seq_len": 8,
                                     "tokenizer": "byte",
                                     "val_fraction": config_dict.placeholder(float),
                                     "packing": config_dict.placeholder(str)})
    ds = data.build(cfg, seed=0)
    assert len(ds.val_tokens) == 40  # the default 0.1 held out
    np.testing.assert_array_equal(ds.batch(1, 2)["inputs"],
                                  data.build(dict(cfg), seed=0).batch(1, 2)["inputs"])


def test_decode_can_skip_specials():
    tok = tokenizers.WithSpecials(tokenizers.ByteTokenizer(), ["<|eod|>"])
    ids = tok.encode("ab") + [256] + tok.encode("c")
    assert tok.decode(ids) == "ab<|eod|>c"
    assert tok.decode(ids, skip_specials=True) == "abc"
