"""RULER's harder needles in data/niah.py: a haystack made of needles (MK-NIAH-2/3),
multi-value needles (MV-NIAH) and 7-digit values; num_values=1 unchanged."""
import hashlib

import numpy as np
import pytest

import data
from data import niah

BASE = 40  # a small text vocabulary keeps the ids readable
NEEDLE, Q, DIGIT0, KEY0 = BASE, BASE + 1, BASE + 2, BASE + 12


def full(out, i):
    """The whole seq_len + 1 token example i: inputs then the last target."""
    return np.append(out["inputs"][i], out["targets"][i][-1])


def parse(seq, key_len, num_digits):
    """An independent reading of one example: (query start, needles as (start, key
    tuple, value digits 0-9), the asked key, the answer digits after it)."""
    q = int(np.nonzero(seq == Q)[0][-1])
    L = 1 + key_len + num_digits
    needles = []
    for p in np.nonzero(seq[:q] == NEEDLE)[0]:
        p = int(p)
        key = tuple(int(k) - KEY0 for k in seq[p + 1:p + 1 + key_len])
        val = seq[p + 1 + key_len:p + L] - DIGIT0
        assert ((val >= 0) & (val < 10)).all() and all(0 <= k < 64 for k in key)
        needles.append((p, key, val))
    asked = tuple(int(k) - KEY0 for k in seq[q + 1:q + 1 + key_len])
    return q, needles, asked, seq[q + 1 + key_len:] - DIGIT0


def check_mask_and_targets(out, i, answer_len):
    """The mask is 1 exactly at the targets that are the answer digits."""
    T = out["inputs"].shape[1]
    m = out["mask"][i]
    np.testing.assert_array_equal(np.nonzero(m)[0], np.arange(T - answer_len, T))
    np.testing.assert_array_equal(out["targets"][i][m > 0] - DIGIT0, out["digits"][i])


# ----------------------------------------------------------------------------- num_values=1
# sha256 of (inputs, targets, mask, needle_pos, digits, depth) drawn by data/niah.py at
# commit 14d0607, before niah_haystack / num_values existed.
BEFORE = [
    (dict(seed=0, n=16, seq_len=128, depth=None, kind="passkey"),
     "a14a55eab94f2ce8fe59705ea1335ac2ee2f46ee3ee6a207653b6cc8e62e62e7"),
    (dict(seed=1, n=16, seq_len=200, depth=0.3, kind="multikey", num_keys=5),
     "ca1dd1e65587f3d135a9bee3a0685b6a90bf4bdfa6f6fec70c84591b594a1c74"),
    (dict(seed=2, n=8, seq_len=256, depth=[0.0, 0.2, 0.5, 0.7, 1.0, 0.9, 0.1, 0.4],
          kind="multikey", num_keys=3, key_len=2, num_digits=7),
     "1525e554e9f6808126f8c6149dbffd3eefab42f52455f5be5478915924478c9e"),
    (dict(seed=3, n=8, seq_len=96, depth=0.5, kind="passkey", filler="stream",
          num_digits=7),
     "5b5724a0a08473c7fc670393ff577f52299bee5ec40cdcfe1ff0ffa224c87586"),
    (dict(seed=4, n=8, seq_len=160, depth=None, kind="multikey", num_keys=8,
          filler="stream", base_vocab=200, key_vocab=16),
     "1ff9f0a005ddea06fae7a78e04339fd532991a5708c1e360d5fc9427731c6daf"),
]
BEFORE_DATASET = "2eee0c7b729a7c1c30b28f55f571bdbaa8370802a1969c11bbfb30b050c13ee6"


def digest(arrays: dict, keys) -> str:
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("case,want", BEFORE)
def test_one_value_in_filler_draws_the_examples_it_drew_before(case, want, explicit):
    c = dict(case)
    seed, n, T, depth = c.pop("seed"), c.pop("n"), c.pop("seq_len"), c.pop("depth")
    if c.pop("filler", None) == "stream":
        c["filler_tokens"] = (np.arange(5000) * 7) % 199
    if explicit:
        c.update(haystack="filler", num_values=1)
    out = niah.generate(np.random.default_rng(seed), n, T, depth, **c)
    keys = ("inputs", "targets", "mask", "needle_pos", "digits", "depth")
    assert digest(out, keys) == want
    np.testing.assert_array_equal(out["value_pos"][:, 0], out["needle_pos"])


def test_the_dataset_with_default_keys_draws_the_batches_it_drew_before():
    for extra in ({}, {"niah_haystack": "filler", "num_values": 1}):
        ds = data.build({"source": "niah", "seq_len": 128, "niah_kind": "multikey",
                         "num_keys": 3, "niah_depths": [0.0, 0.5, 1.0], **extra}, seed=4)
        h = hashlib.sha256()
        for split in ("train", "val"):
            b = ds.batch(2, 16, split)
            for k in sorted(b):
                h.update(k.encode())
                h.update(np.ascontiguousarray(b[k]).tobytes())
        assert h.hexdigest() == BEFORE_DATASET


# ----------------------------------------------------------------------------- MK-NIAH-2/3
@pytest.mark.parametrize("key_len,num_digits,seq_len",
                         [(2, 7, 300), (4, 16, 257), (1, 5, 64)])
def test_a_haystack_of_needles(key_len, num_digits, seq_len):
    """MK-NIAH-2 (2-id keys, 7 digits) and -3 (4-id keys, 16 digits): after a preamble of
    H mod L filler tokens the haystack is nothing but needles, floor(H / L) of them, each
    with its own key; the queried one at slot round(depth (n - 1)); the answer its value."""
    L = 1 + key_len + num_digits
    hay = seq_len + 1 - (1 + key_len + num_digits)
    n, lead = hay // L, hay % L
    depths = np.linspace(0, 1, 11)
    out = niah.generate(np.random.default_rng(5), len(depths), seq_len, depths,
                        kind="multikey", key_len=key_len, num_digits=num_digits,
                        base_vocab=BASE, haystack="needles", num_keys=999)
    assert out["inputs"].shape == out["targets"].shape == (len(depths), seq_len)
    assert out["digits"].shape == (len(depths), num_digits)
    for i, d in enumerate(depths):
        seq = full(out, i)
        q, needles, asked, answer = parse(seq, key_len, num_digits)
        assert q == hay and len(needles) == n
        assert (seq[:lead] < BASE).all()  # the preamble is filler
        # needles back to back from the end of the preamble to the query: nothing else
        assert [p for p, _, _ in needles] == [lead + k * L for k in range(n)]
        keys = [k for _, k, _ in needles]
        assert len(set(keys)) == n  # distinct keys, so one needle answers the query
        (hit,) = [(p, v) for p, k, v in needles if k == asked]
        want_pos = lead + int(round(d * (n - 1))) * L
        assert hit[0] == want_pos == out["needle_pos"][i] == out["value_pos"][i, 0]
        np.testing.assert_array_equal(answer, hit[1])
        np.testing.assert_array_equal(out["digits"][i], hit[1])
        check_mask_and_targets(out, i, num_digits)


def test_needle_haystack_preamble_is_a_window_of_the_text():
    stream = np.arange(3000) % 37
    out = niah.generate(np.random.default_rng(1), 6, 153, 0.5, kind="multikey", key_len=2,
                        num_digits=7, base_vocab=BASE, haystack="needles",
                        filler_tokens=stream)
    lead = (154 - 10) % 10  # H mod L of a 144-token haystack of 10-token needles
    for i in range(6):
        pre = out["inputs"][i][:lead]
        np.testing.assert_array_equal(pre, (pre[0] + np.arange(lead)) % 37)
        assert out["inputs"][i][lead] == NEEDLE


# ----------------------------------------------------------------------------- MV-NIAH
@pytest.mark.parametrize("kind,num_keys",
                         [("multikey", 1), ("multikey", 3), ("passkey", 1)])
def test_multi_value_needles_in_filler(kind, num_keys):
    """Every key in num_values needles with different draws; the first queried one at
    round(depth (H - V L)); the answer is the queried key's values in document order."""
    V, D, seq_len = 4, 7, 256
    key_len = 1 if kind == "multikey" else 0
    L = 1 + key_len + D
    hay = seq_len + 1 - (1 + key_len + V * D)
    depths = np.array([0.0, 0.1, 0.3, 0.5, 0.8, 0.95, 1.0] * 3)
    out = niah.generate(np.random.default_rng(7), len(depths), seq_len, depths, kind=kind,
                        num_keys=num_keys, num_digits=D, num_values=V, base_vocab=BASE)
    assert out["digits"].shape == (len(depths), V * D)
    assert out["value_pos"].shape == (len(depths), V)
    for i, d in enumerate(depths):
        seq = full(out, i)
        q, needles, asked, answer = parse(seq, key_len, D)
        assert q == hay and len(needles) == num_keys * V
        keys = [k for _, k, _ in needles]
        assert all(keys.count(k) == V for k in keys) and len(set(keys)) == num_keys
        mine = [(p, v) for p, k, v in needles if k == asked]
        starts = [p for p, _ in mine]
        assert starts == sorted(starts) == list(out["value_pos"][i])
        assert mine[0][0] == int(round(d * (hay - V * L))) == out["needle_pos"][i]
        np.testing.assert_array_equal(answer, np.concatenate([v for _, v in mine]))
        check_mask_and_targets(out, i, V * D)
        # needles do not overlap one another and the filler holds text ids only
        starts = [p for p, _, _ in needles]
        assert all(b - a >= L for a, b in zip(starts, starts[1:]))
        rest = np.delete(seq[:q], np.concatenate([np.arange(p, p + L) for p in starts]))
        assert (rest < BASE).all() and len(rest) == hay - len(needles) * L


def test_multi_value_spreads_the_other_values_after_the_first():
    """Over many draws at depth 0 the later values land all over the rest of the
    haystack (not packed next to the first), and before them every distractor can fall."""
    out = niah.generate(np.random.default_rng(3), 200, 256, 0.0, kind="multikey",
                        num_keys=1, num_values=4, base_vocab=BASE)
    later = out["value_pos"][:, 1:].ravel()
    assert out["value_pos"][:, 0].max() == 0
    assert later.min() < 40 and later.max() > 180


def test_multi_value_in_a_haystack_of_needles():
    V, D, key_len, seq_len = 3, 7, 2, 200
    L = 1 + key_len + D
    hay = seq_len + 1 - (1 + key_len + V * D)
    n, lead = hay // L, hay % L
    depths = np.linspace(0, 1, 9)
    out = niah.generate(np.random.default_rng(2), len(depths), seq_len, depths,
                        kind="multikey", key_len=key_len, num_digits=D, num_values=V,
                        base_vocab=BASE, haystack="needles")
    for i, d in enumerate(depths):
        seq = full(out, i)
        q, needles, asked, answer = parse(seq, key_len, D)
        assert q == hay and [p for p, _, _ in needles] == [lead + k * L for k in range(n)]
        keys = [k for _, k, _ in needles]
        others = [k for k in keys if k != asked]
        assert keys.count(asked) == V and len(set(others)) == len(others) == n - V
        mine = [(p, v) for p, k, v in needles if k == asked]
        assert mine[0][0] == lead + int(round(d * (n - V))) * L
        assert [p for p, _ in mine] == list(out["value_pos"][i])
        np.testing.assert_array_equal(answer, np.concatenate([v for _, v in mine]))
        check_mask_and_targets(out, i, V * D)


# ----------------------------------------------------------------------------- 7 digits
@pytest.mark.parametrize("kind", ["passkey", "multikey"])
def test_seven_digit_values(kind):
    """RULER's 7-digit numbers: needle and query lengths, mask of 7, the needle's digits."""
    key_len = 2 if kind == "multikey" else 0
    L = 1 + key_len + 7
    seq_len = 128
    hay = seq_len + 1 - L
    assert niah.layout(seq_len, kind, 4, 7, 2)[:2] == (hay, L)
    out = niah.generate(np.random.default_rng(0), 100, seq_len, None, kind=kind,
                        num_digits=7, key_len=2, base_vocab=BASE)
    for i in range(100):
        seq = full(out, i)
        q, needles, asked, answer = parse(seq, key_len, 7)
        assert q == hay and len(answer) == 7
        (hit,) = [v for p, k, v in needles if k == asked]
        np.testing.assert_array_equal(answer, hit)
        check_mask_and_targets(out, i, 7)
        assert out["mask"][i].sum() == 7
    # all ten digits appear in every position across examples
    assert all(len(set(out["digits"][:, j])) == 10 for j in range(7))


# ----------------------------------------------------------------------------- the dataset
def test_dataset_keys_determinism_and_vocab():
    cfg = {"source": "niah", "seq_len": 160, "niah_kind": "multikey", "key_len": 2,
           "num_digits": 7, "niah_haystack": "needles", "num_values": 2}
    ds = data.build(cfg, seed=3)
    assert (ds.haystack, ds.num_values) == ("needles", 2)
    assert ds.vocab_size == 256 + 12 + 64
    a = ds.batch(5, 8)
    again = data.build(cfg, seed=3).batch(5, 8)
    np.testing.assert_array_equal(a["inputs"], again["inputs"])
    assert not np.array_equal(a["inputs"], ds.batch(6, 8)["inputs"])
    assert not np.array_equal(a["inputs"], data.build(cfg, seed=4).batch(5, 8)["inputs"])
    assert not np.array_equal(a["inputs"], ds.batch(5, 8, "val")["inputs"])
    assert (a["mask"].sum(1) == 14).all()
    # generate itself: the same seed, the same examples, bitwise
    kw = dict(kind="multikey", key_len=4, num_digits=16, haystack="needles", num_values=2)
    x, y = (niah.generate(np.random.default_rng(9), 5, 200, None, **kw) for _ in range(2))
    for k in x:
        np.testing.assert_array_equal(x[k], y[k])
    z = niah.generate(np.random.default_rng(10), 5, 200, None, **kw)
    assert not np.array_equal(x["inputs"], z["inputs"])


def test_clear_errors():
    with pytest.raises(ValueError, match="niah_kind=multikey"):
        niah.generate(0, 1, 128, 0.5, kind="passkey", haystack="needles")
    with pytest.raises(ValueError, match="haystack"):
        niah.generate(0, 1, 128, 0.5, kind="multikey", haystack="essay")
    with pytest.raises(ValueError, match="raise key_len"):
        # 1,000 tokens of 7-token needles: ~140 keys, more than key_vocab 64
        niah.generate(0, 1, 1000, 0.5, kind="multikey", haystack="needles")
    with pytest.raises(ValueError, match="too short"):
        niah.generate(0, 1, 30, 0.5, kind="multikey", haystack="needles", num_values=3)
    with pytest.raises(ValueError, match="too short"):
        niah.generate(0, 1, 64, 0.5, kind="multikey", num_keys=4, num_values=4)
    with pytest.raises(ValueError, match="num_values"):
        niah.generate(0, 1, 64, 0.5, num_values=0)
    with pytest.raises(ValueError, match="raise key_len"):  # checked when the run starts
        data.build({"source": "niah", "seq_len": 1000, "niah_kind": "multikey",
                    "niah_haystack": "needles"}, seed=0)


def test_config_check_names_the_keys():
    from configs import base
    from training import config_tools

    c = base.get_config()
    c.data.source = "niah"
    c.data.niah_haystack = "essay"
    with pytest.raises(config_tools.ConfigError, match="niah_haystack='essay'"):
        config_tools.check_config(c)
    c.data.niah_haystack = "needles"
    c.data.num_values = 0
    with pytest.raises(config_tools.ConfigError, match="num_values=0"):
        config_tools.check_config(c)
    c.data.num_values = 4
    config_tools.check_config(c)
