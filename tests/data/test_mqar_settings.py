"""MQAR's mixture of settings (Zoology's Based-era training data): rows drawn by weight,
each an MQAR example of its own (seq_len, kv) padded with masked filler, masks 1/kv."""
import numpy as np
import pytest

import data
from data import mqar

V = 256
ZOOLOGY = [[16, 2, 5], [32, 4, 1], [64, 8, 1], [64, 16, 1]]  # a small copy of its mixture


def _build(settings=ZOOLOGY, seq_len=64, **kw):
    return data.build({"source": "mqar", "seq_len": seq_len, "vocab_size": V,
                       "num_kv_pairs": settings, **kw}, seed=3)


def _row_setting(mask_row):
    """(length, kv) a row was drawn at: kv = its query count; the length is the row's
    used prefix (checked by the caller)."""
    q = np.nonzero(mask_row > 0)[0]
    return len(q), q


def test_each_row_is_an_mqar_example_of_its_setting_padded_and_weighted():
    ds = _build()
    seen = {}
    for step in range(6):
        b = ds.batch(step, 64)
        for inp, tgt, m in zip(b["inputs"], b["targets"], b["mask"]):
            kv, q = _row_setting(m)
            (t,) = [s[0] for s in ZOOLOGY if s[1] == kv]
            seen[(t, kv)] = seen.get((t, kv), 0) + 1
            # each query weighs 1/kv: every example sums to 1 in the loss
            assert np.allclose(m[q], 1.0 / kv) and m.sum() == pytest.approx(1.0)
            # past the setting's length: masked filler 0s, which a causal model never
            # sees from the example's own positions
            assert not inp[t:].any() and not tgt[t:].any() and not m[t:].any()
            # the example itself: kv keys in [1, V/2), their values in [V/2, V), each key
            # queried once after the context, its target the key's value
            keys, vals = inp[0:2 * kv:2], inp[1:2 * kv:2]
            assert len(set(keys)) == kv and keys.min() >= 1 and keys.max() < V // 2
            assert vals.min() >= V // 2 and vals.max() < V
            assert q.min() >= 2 * kv and q.max() < t and (q % 2 == 0).all()
            assert sorted(inp[q]) == sorted(keys)
            value_of = dict(zip(keys, vals))
            assert [tgt[p] for p in q] == [value_of[inp[p]] for p in q]
    assert set(seen) == {(s[0], s[1]) for s in ZOOLOGY}
    # 384 rows drawn with p = 5/8, 1/8, 1/8, 1/8: within 4 binomial sigmas
    n = sum(seen.values())
    for t, kv, w in ZOOLOGY:
        p = w / 8
        assert abs(seen[(t, kv)] - n * p) < 4 * np.sqrt(n * p * (1 - p)), (t, kv)


def test_the_batch_is_a_function_of_seed_and_step_and_eval_is_held_out():
    a, b = _build(), _build()
    for key in ("inputs", "targets", "mask"):
        assert np.array_equal(a.batch(5, 16)[key], b.batch(5, 16)[key])
    assert not np.array_equal(a.batch(5, 16)["inputs"], a.batch(6, 16)["inputs"])
    ev = next(iter(a.eval_batches(16, 1)))
    assert not np.array_equal(ev["inputs"], a.batch(0, 16)["inputs"])


def test_random_filler_stays_inside_the_example():
    ds = _build(random_non_queries=True)
    b = ds.batch(0, 32)
    for inp, m in zip(b["inputs"], b["mask"]):
        kv = int((m > 0).sum())
        (t,) = [s[0] for s in ZOOLOGY if s[1] == kv]
        assert (inp[2 * kv:t] != 0).mean() > 0.5 and not inp[t:].any()


def test_padding_cannot_change_a_causal_models_outputs_at_the_examples_positions():
    """The claim the mixture rests on: a (16, 2) example padded to 64 gives, at its 16
    positions, the logits of the example alone, for Zoology's layout (BaseConv, then
    softmax or gated delta net)."""
    import jax.numpy as jnp
    from flax import nnx

    from models import ModelConfig
    from models.lm import LanguageModel

    ex = mqar.generate(np.random.default_rng(0), 3, 16, 2, V)
    padded = np.zeros((3, 64), np.int32)
    padded[:, :16] = ex["inputs"]
    padded[:, 16:] = 7  # any filler: the first 16 positions must not see it
    for mixer, impl in (("softmax", "chunk"), ("gated_deltanet", "recurrent")):
        cfg = ModelConfig(vocab_size=V, d_model=32, num_layers=2, num_heads=2, mlp=False,
                          mixer=mixer, layer_pattern="base_conv,mixer", impl=impl,
                          chunk_size=8, positions="none", norm="layernorm",
                          tie_embeddings=True)
        model = LanguageModel(cfg, rngs=nnx.Rngs(0))
        call = nnx.jit(lambda m, x: m(x))
        short = call(model, jnp.asarray(ex["inputs"]))
        long = call(model, jnp.asarray(padded))[:, :16]
        assert float(jnp.max(jnp.abs(short - long))) < 1e-5, mixer


@pytest.mark.parametrize("bad,match", [
    ([[128, 4, 1]], "exceeds data.seq_len 64"),
    ([[64, 4, 0.0]], "weight 0.0 must be a positive number"),
    ([[64, 4], 8], "entries only"),
    ([[64, 20, 1]], "seq_len >= 4 \\* num_kv_pairs"),
])
def test_bad_settings_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        _build(bad)


def test_config_check_takes_settings_from_the_command_line():
    from configs import base
    from training import config_tools

    c = base.get_config()
    c.data.source, c.data.seq_len = "mqar", 256
    config_tools.check_overrides(
        c, {"data.num_kv_pairs": "[[64,4,5],[128,8,1],[256,16]]"})
    config_tools.set_values(c, {"data.num_kv_pairs": [[64, 4, 5], [128, 8, 1], [256, 16]]})
    config_tools.check_config(c)
    for bad in ([[64, 4, 0]], [[64]], [[64, 4], 4], [[64, True, 1]]):
        c.data.num_kv_pairs = bad
        with pytest.raises(config_tools.ConfigError,
                           match="data.num_kv_pairs=.*list of \\[seq_len, kv, weight\\]"):
            config_tools.check_config(c)


def test_recall_eval_draws_the_runs_filler():
    """eval.recall's test examples carry random filler when the run trained with it."""
    from eval import recall

    for rnq in (False, True):
        ds = _build(random_non_queries=rnq)
        task = recall.mqar_task(None, ds)
        assert task["random_non_queries"] is rnq
        seen = []

        def stats(batch):
            seen.append(np.asarray(batch["inputs"]))
            return np.zeros(batch["inputs"].shape), np.zeros(batch["inputs"].shape, bool)
        recall.mqar_grid(stats, task, [(32, 4)], num_examples=8, progress=False)
        filler = np.concatenate(seen)[:, 8:]
        assert (filler != 0).mean() > 0.5 if rnq else (filler == 0).mean() > 0.5
