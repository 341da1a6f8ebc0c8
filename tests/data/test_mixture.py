"""Mixtures: per-row component choice, one vocabulary, same keys and shapes."""
import numpy as np
import pytest

import data
from data.order import derive_seed


def text_file(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("".join(f"sentence {i} of a small corpus.\n" for i in range(400)))
    return str(f)


def mixture_cfg(tmp_path):
    return {"source": "mixture", "seq_len": 64, "components": {
        "text": {"source": "files", "files": text_file(tmp_path), "weight": 2.0},
        "mqar": {"source": "mqar", "num_kv_pairs": 4, "vocab_size": 512, "weight": 1.0},
        "niah": {"source": "niah", "niah_kind": "passkey", "weight": 1.0}}}


def test_rows_follow_rng_of_seed_step_row_and_match_components(tmp_path):
    ds = data.build(mixture_cfg(tmp_path), seed=7)
    step, bs = 3, 32
    b = ds.batch(step, bs)
    cdf = np.cumsum([0.5, 0.25, 0.25])
    which = [int(np.searchsorted(cdf, np.random.default_rng([7, step, r]).random(), "right"))
             for r in range(bs)]
    np.testing.assert_array_equal(ds.choose(step, bs, "train"), which)
    for c, name in enumerate(["text", "mqar", "niah"]):
        rows = [r for r in range(bs) if which[r] == c]
        sub = ds.components[name].batch(step, len(rows))
        for k in data.BATCH_KEYS:
            np.testing.assert_array_equal(b[k][rows], sub[k])
    again = data.build(mixture_cfg(tmp_path), seed=7).batch(step, bs)
    for k in data.BATCH_KEYS:
        np.testing.assert_array_equal(b[k], again[k])
    assert b["inputs"].shape == (bs, 64) and b["inputs"].dtype == np.int32
    assert b["mask"].dtype == np.float32 and b["segment_ids"].dtype == np.int32


def test_vocabulary_layout_is_disjoint(tmp_path):
    ds = data.build(mixture_cfg(tmp_path), seed=0)
    # bytes + EOD | NIAH's 12 + 64 specials | MQAR's 512 ids
    assert ds.components["text"].vocab_size == 257
    assert ds.components["niah"].base_vocab == 257
    off = ds.components["mqar"].vocab_offset
    assert off == 257 + 76 and ds.vocab_size == off + 512
    which = ds.choose(0, 64, "train")
    b = ds.batch(0, 64)
    text, mq, nh = (b["inputs"][which == c] for c in range(3))
    assert text.max() < 257
    assert ((mq >= off) & (mq < off + 512)).all()
    assert (nh == 257).any() and (nh == 258).any()  # [NEEDLE], [Q]
    assert nh.max() < off
    assert ds.tokenizer.decode([257, off + 3]) == "[NEEDLE]<mqar3>"
    # the MQAR rows are Zoology's layout shifted by the offset
    mq_t = b["targets"][which == 1][b["mask"][which == 1] > 0]
    assert ((mq_t >= off + 256) & (mq_t < off + 512)).all()


def test_weights_are_respected(tmp_path):
    ds = data.build(mixture_cfg(tmp_path), seed=1)
    which = np.concatenate([ds.choose(s, 100, "train") for s in range(30)])
    frac = np.bincount(which, minlength=3) / len(which)
    np.testing.assert_allclose(frac, [0.5, 0.25, 0.25], atol=0.04)
    assert derive_seed(1, 0) != derive_seed(1, 1)


def test_eval_batches_are_fixed_held_out_batches(tmp_path):
    ds = data.build(mixture_cfg(tmp_path), seed=2)
    ev = list(ds.eval_batches(8, 2))
    assert len(ev) == 2
    np.testing.assert_array_equal(ev[1]["inputs"], ds.batch(1, 8, "val")["inputs"])
    assert not np.array_equal(ev[0]["inputs"], ds.batch(0, 8)["inputs"])


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="components"):
        data.build({"source": "mixture"}, seed=0)
    with pytest.raises(ValueError, match="seq_len"):
        data.build({"source": "mixture", "seq_len": 64, "components": [
            {"source": "mqar", "seq_len": 64}, {"source": "mqar", "seq_len": 128}]}, seed=0)
    with pytest.raises(ValueError, match="weight"):
        data.build({"source": "mixture", "seq_len": 64, "components": [
            {"source": "mqar", "weight": -1}]}, seed=0)


def test_top_level_vocab_size_stays_with_the_text_tokenizer(tmp_path):
    cfg = {"source": "mixture", "seq_len": 64, "vocab_size": 300, "components": [
        {"source": "mqar", "num_kv_pairs": 2},
        {"source": "mqar", "num_kv_pairs": 2, "vocab_size": 128}]}
    ds = data.build(cfg, seed=0)
    a, b = ds.components["mqar0"], ds.components["mqar1"]
    assert a.task_vocab == 8192 and b.task_vocab == 128
    assert ds.vocab_size == 8192 + 128  # no text: each task's range, in order
    assert (a.vocab_offset, b.vocab_offset) == (0, 8192)


def test_two_niah_tasks_share_their_special_ids():
    cfg = {"source": "mixture", "seq_len": 64, "components": {
        "passkey": {"source": "niah", "niah_kind": "passkey"},
        "multikey": {"source": "niah", "niah_kind": "multikey", "num_keys": 2}}}
    ds = data.build(cfg, seed=0)
    assert ds.vocab_size == 256 + 12 + 64
    p, m = ds.components["passkey"], ds.components["multikey"]
    assert p.base_vocab == m.base_vocab == 256
    b = ds.batch(0, 16)
    assert ((b["inputs"] == 257).sum(axis=1) == 1).all()  # one [Q] per row, same id


def test_loss_weight_scales_only_its_components_mask(tmp_path):
    """loss_weight multiplies a component's loss mask; everything else is unchanged."""
    cfg = mixture_cfg(tmp_path)
    plain = data.build(cfg, seed=3).batch(5, 32)
    cfg["components"]["niah"]["loss_weight"] = 40.0
    weighted = data.build(cfg, seed=3)
    b = weighted.batch(5, 32)
    niah = weighted.choose(5, 32, "train") == 2
    assert niah.any() and (~niah).any()
    np.testing.assert_array_equal(b["mask"][niah], 40.0 * plain["mask"][niah])
    np.testing.assert_array_equal(b["mask"][~niah], plain["mask"][~niah])
    for k in ("inputs", "targets", "segment_ids"):
        np.testing.assert_array_equal(b[k], plain[k])
    for bad in (0.0, -1.0, float("nan")):
        cfg["components"]["niah"]["loss_weight"] = bad
        with pytest.raises(ValueError, match="loss_weight"):
            data.build(cfg, seed=3)
