"""Needle in a haystack: placement at depth, answers, multi-key queries."""
import numpy as np
import pytest

import data
from data import niah

BASE = 256
NEEDLE, Q, DIGIT0, KEY0 = BASE, BASE + 1, BASE + 2, BASE + 12


def parse(row):
    """Independent reading of one example: haystack length, needles, query."""
    q = int(np.nonzero(row == Q)[0][-1])
    needles = [int(p) for p in np.nonzero(row[:q] == NEEDLE)[0]]
    return q, needles


@pytest.mark.parametrize("kind", ["passkey", "multikey"])
def test_needle_lands_at_the_requested_depth(kind):
    depths = np.array([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0] * 4)
    seq_len = 256
    out = niah.generate(np.random.default_rng(0), len(depths), seq_len, depths, kind=kind,
                        num_keys=4)
    needle_len = 6 if kind == "passkey" else 7
    for i, d in enumerate(depths):
        row = out["inputs"][i]
        # the full sequence has seq_len + 1 tokens: the query part is [Q] (key) 5 digits
        hay = seq_len + 1 - (6 if kind == "passkey" else 7)
        q, needles = parse(row)
        assert q == hay
        pos = out["needle_pos"][i]
        assert row[pos] == NEEDLE and pos in needles
        assert abs(pos / hay - d) <= needle_len / hay + 1e-9
        assert pos + needle_len <= hay


def test_passkey_answer_is_the_needle_digits():
    out = niah.generate(1, 50, 128, depth=None)
    for i in range(50):
        row, tgt, m = out["inputs"][i], out["targets"][i], out["mask"][i]
        pos = out["needle_pos"][i]
        needle_digits = row[pos + 1:pos + 6]
        assert ((needle_digits >= DIGIT0) & (needle_digits < DIGIT0 + 10)).all()
        np.testing.assert_array_equal(out["digits"][i] + DIGIT0, needle_digits)
        # mask is 1 exactly at [Q] and the first four digits of the answer
        assert m.sum() == 5
        q = int(np.nonzero(row == Q)[0][0])
        np.testing.assert_array_equal(np.nonzero(m)[0], np.arange(q, q + 5))
        np.testing.assert_array_equal(tgt[m > 0], needle_digits)
        # the inputs after [Q] are the answer itself (teacher forcing)
        np.testing.assert_array_equal(row[q + 1:], needle_digits[:4])
        # one needle; the filler uses text ids only
        assert (row == NEEDLE).sum() == 1
        filler = np.delete(row[:q], np.arange(pos, pos + 6))
        assert (filler < BASE).all()


def test_multikey_queries_the_right_key():
    out = niah.generate(2, 40, 192, depth=0.3, kind="multikey", num_keys=5)
    for i in range(40):
        row, tgt, m = out["inputs"][i], out["targets"][i], out["mask"][i]
        q, needles = parse(row)
        assert len(needles) == 5
        keys = [int(row[p + 1]) for p in needles]
        assert len(set(keys)) == 5 and all(KEY0 <= k < KEY0 + 64 for k in keys)
        asked = int(row[q + 1])
        (hit,) = [p for p, k in zip(needles, keys) if k == asked]
        assert hit == out["needle_pos"][i]
        answer = row[hit + 2:hit + 7]
        np.testing.assert_array_equal(tgt[m > 0], answer)
        np.testing.assert_array_equal(np.nonzero(m)[0], np.arange(q + 1, q + 6))
        # distractors carry other digits most of the time; the answer is the queried one
        np.testing.assert_array_equal(out["digits"][i] + DIGIT0, answer)


def test_filler_is_a_window_of_the_given_stream():
    stream = np.arange(1000) % 200
    out = niah.generate(3, 10, 96, depth=0.5, filler_tokens=stream)
    for i in range(10):
        row = out["inputs"][i]
        pos = out["needle_pos"][i]
        q = int(np.nonzero(row == Q)[0][0])
        filler = np.concatenate([row[:pos], row[pos + 6:q]])
        start = int(np.nonzero(stream == filler[0])[0][0])
        # consecutive tokens of the stream (it counts up mod 200)
        np.testing.assert_array_equal(filler, (filler[0] + np.arange(len(filler))) % 200)


def test_too_short_sequences_and_bad_depths_are_clear_errors():
    with pytest.raises(ValueError, match="too short"):
        niah.generate(0, 1, 12, 0.5)
    with pytest.raises(ValueError, match="depth"):
        niah.generate(0, 1, 64, 1.5)
    with pytest.raises(ValueError, match="kind"):
        niah.generate(0, 1, 64, 0.5, kind="multi")


def test_dataset_vocab_depths_and_order(tmp_path):
    cfg = {"source": "niah", "seq_len": 128, "niah_kind": "multikey", "num_keys": 3,
           "niah_depths": [0.0, 0.5, 1.0]}
    ds = data.build(cfg, seed=4)
    assert ds.vocab_size == 256 + 12 + 64
    assert ds.tokenizer.decode([NEEDLE, Q, DIGIT0 + 7, KEY0 + 3]) == "[NEEDLE][Q]<7>[K3]"
    b = ds.batch(2, 16)
    np.testing.assert_array_equal(b["inputs"], data.build(cfg, seed=4).batch(2, 16)["inputs"])
    assert not np.array_equal(b["inputs"], ds.batch(3, 16)["inputs"])
    assert not np.array_equal(b["inputs"], ds.batch(2, 16, "val")["inputs"])
    hay = 129 - 7
    for row in b["inputs"]:
        q, needles = parse(row)
        asked = row[q + 1]
        (pos,) = [p for p in needles if row[p + 1] == asked]
        assert min(abs(pos / hay - d) for d in (0.0, 0.5, 1.0)) <= 7 / hay + 1e-9
    # haystack text from a file, tokenised by the text tokenizer
    f = tmp_path / "hay.txt"
    f.write_text("the grass is green. the sky is blue. " * 40 + "NIGHT IS DARK. " * 20)
    ds = data.build({"source": "niah", "files": str(f), "seq_len": 96, "val_fraction": 0.15},
                    seed=0)
    train_text = ds.tokenizer.decode(ds.batch(0, 8)["inputs"].ravel())
    val_text = ds.tokenizer.decode(ds.batch(0, 8, "val")["inputs"].ravel())
    # training haystacks come from the first 85% of the text, held-out ones from the rest
    assert "the sky is blue" in train_text and "NIGHT" not in train_text
    assert "NIGHT IS DARK" in val_text and "sky" not in val_text
