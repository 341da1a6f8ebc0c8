"""MQAR against Zoology's generator (transcribed as a reference) and its statistics."""
import numpy as np
import pytest

import data
from data import mqar


def zoology_reference(vocab_size, num_examples, input_seq_len, seed, power_a, num_kv_pairs):
    """HazyResearch/zoology multiquery_ar (num_passes=1, random_non_queries=False),
    transcribed with NumPy in place of torch. Labels use -100 for ignored positions."""
    np.random.seed(seed)
    context_size = num_kv_pairs * 2
    key_vocab_size = vocab_size // 2
    key_choices = np.arange(1, key_vocab_size)
    value_choices = np.arange(key_vocab_size, vocab_size)
    keys_unshuffled = np.tile(key_choices, (num_examples, 1))
    keys = np.apply_along_axis(np.random.choice, 1, keys_unshuffled, replace=False, size=num_kv_pairs)
    values_unshuffled = np.tile(value_choices, (num_examples, 1))
    values = np.apply_along_axis(np.random.choice, 1, values_unshuffled, replace=False, size=num_kv_pairs)
    kvs = np.zeros((num_examples, context_size), dtype=np.int64)
    kvs[:, 0::2] = keys
    kvs[:, 1::2] = values
    space = (input_seq_len - context_size) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    x = np.stack([np.arange(space, dtype=int)] * num_examples)
    gaps = np.apply_along_axis(np.random.choice, axis=1, arr=x, replace=False, p=p, size=num_kv_pairs)
    queries = np.zeros((num_examples, input_seq_len - context_size + 1), dtype=np.int64)
    np.put_along_axis(queries, (gaps * 2), values=keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)
    labels = np.full((num_examples, input_seq_len + 1), -100, dtype=np.int64)
    np.put_along_axis(labels, (gaps * 2) + context_size + 1, values=values, axis=1)
    return examples[:, :-1], labels[:, 1:]


@pytest.mark.parametrize("seq_len,n", [(64, 4), (128, 8), (256, 16)])
def test_matches_zoology_bit_for_bit_with_randomstate(seq_len, n):
    ref_inputs, ref_labels = zoology_reference(8192, 20, seq_len, 123, 0.01, n)
    out = mqar.generate(np.random.RandomState(123), 20, seq_len, n)
    np.testing.assert_array_equal(out["inputs"], ref_inputs)
    labelled = ref_labels != -100
    np.testing.assert_array_equal(out["mask"] == 1, labelled)
    np.testing.assert_array_equal(out["targets"][labelled], ref_labels[labelled])


def test_layout_keys_values_queries():
    V, T, n, N = 8192, 128, 8, 300
    out = mqar.generate(np.random.default_rng(0), N, T, n, vocab_size=V)
    x, y, m = out["inputs"], out["targets"], out["mask"]
    assert x.shape == y.shape == m.shape == (N, T)
    assert x.dtype == np.int32 and y.dtype == np.int32 and m.dtype == np.float32
    keys, values = x[:, 0:2 * n:2], x[:, 1:2 * n:2]
    assert ((keys >= 1) & (keys < V // 2)).all()
    assert ((values >= V // 2) & (values < V)).all()
    for i in range(N):
        assert len(set(keys[i])) == n  # distinct keys
        answer = dict(zip(keys[i], values[i]))  # pairs adjacent in the context
        rest = x[i, 2 * n:]
        qpos = np.nonzero(rest)[0] + 2 * n
        # every key queried exactly once, only at even offsets after the context
        assert sorted(x[i, qpos]) == sorted(keys[i])
        assert ((qpos - 2 * n) % 2 == 0).all()
        # labels only at query positions, each the queried key's value
        np.testing.assert_array_equal(np.nonzero(m[i])[0], qpos)
        for q in qpos:
            assert y[i, q] == answer[x[i, q]]
        # the other targets are the next input tokens
        other = np.setdiff1d(np.arange(T - 1), qpos)
        np.testing.assert_array_equal(y[i, other], x[i, other + 1])


def test_first_query_gap_follows_power_law():
    # The first key drawn is placed at gap g with probability exactly p(g).
    T, n, N = 128, 8, 3000
    out = mqar.generate(np.random.default_rng(1), N, T, n)
    x = out["inputs"]
    first_key = x[:, 0]
    gap = np.array([(np.nonzero(x[i, 2 * n:] == first_key[i])[0][0]) // 2 for i in range(N)])
    space = (T - 2 * n) // 2
    p = (np.arange(1, space + 1, dtype=np.float64)) ** (0.01 - 1)
    p /= p.sum()
    bins = [0, 1, 2, 4, 8, 16, space]
    observed = np.array([((gap >= a) & (gap < b)).sum() for a, b in zip(bins[:-1], bins[1:])])
    expected = np.array([p[a:b].sum() for a, b in zip(bins[:-1], bins[1:])]) * N
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < 20.5, (observed, expected)  # df = 5, p = 0.001 critical value


def test_two_pair_gap_inclusion_matches_analytic():
    # For n = 2 without replacement: P(g drawn) = p_g (1 + sum_{h != g} p_h / (1 - p_h)).
    T, n, N = 64, 2, 6000
    space = (T - 2 * n) // 2
    p = mqar.gap_probabilities(space)
    incl = p * (1 + (p / (1 - p)).sum() - p / (1 - p))
    assert abs(incl.sum() - 2) < 1e-12
    x = mqar.generate(np.random.default_rng(2), N, T, n)["inputs"]
    counts = np.zeros(space)
    for i in range(N):
        counts[(np.nonzero(x[i, 2 * n:])[0]) // 2] += 1
    sigma = np.sqrt(N * incl * (1 - incl))
    assert (np.abs(counts - N * incl) < 4.5 * sigma + 1).all()


def test_deterministic_for_a_seed():
    a = mqar.generate(7, 16, 64, 4)
    b = mqar.generate(7, 16, 64, 4)
    c = mqar.generate(8, 16, 64, 4)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["inputs"], c["inputs"])


def test_random_non_queries_fills_the_zeros():
    out = mqar.generate(0, 8, 64, 4, random_non_queries=True)
    assert (out["inputs"] != 0).mean() > 0.95
    assert out["mask"].sum() == 8 * 4


def test_bad_shapes_give_clear_errors():
    with pytest.raises(ValueError, match="even"):
        mqar.generate(0, 1, 63, 4)
    with pytest.raises(ValueError, match="4 \\* num_kv_pairs"):
        mqar.generate(0, 1, 64, 17)


def test_dataset_order_is_a_function_of_seed_and_step():
    cfg = {"source": "mqar", "seq_len": 64, "num_kv_pairs": 4}
    a, b = data.build(cfg, seed=3), data.build(cfg, seed=3)
    assert a.vocab_size == 8192
    x1, x2 = a.batch(5, 8), b.batch(5, 8)
    for k in data.BATCH_KEYS:
        np.testing.assert_array_equal(x1[k], x2[k])
    assert set(x1) == set(data.BATCH_KEYS)
    assert (x1["segment_ids"] == 1).all()
    assert not np.array_equal(a.batch(6, 8)["inputs"], x1["inputs"])
    assert not np.array_equal(a.batch(5, 8, "val")["inputs"], x1["inputs"])
    # the held-out set is fixed: the same on every call, and the same as batch(i, "val")
    e1 = [e["inputs"] for e in a.eval_batches(4, 3)]
    e2 = [e["inputs"] for e in b.eval_batches(4, 3)]
    np.testing.assert_array_equal(np.stack(e1), np.stack(e2))
    np.testing.assert_array_equal(e1[2], a.batch(2, 4, "val")["inputs"])
    # step s of a run is the Zoology generator fed rng([seed, step])
    ref = mqar.generate(np.random.default_rng([3, 5]), 8, 64, 4)
    np.testing.assert_array_equal(x1["inputs"], ref["inputs"])


def test_dataset_with_several_kv_counts():
    ds = data.build({"source": "mqar", "seq_len": 64, "num_kv_pairs": [2, 4, 8]}, seed=0)
    b = ds.batch(0, 60)
    queries = b["mask"].sum(axis=1).astype(int)
    assert set(queries.tolist()) == {2, 4, 8}
    for row, n in zip(b["inputs"], queries):
        keys = row[0:2 * n:2]
        assert ((keys >= 1) & (keys < 4096)).all() and len(set(keys)) == n
        assert (row[2 * n:] != 0).sum() == n  # each key queried once after its context
    np.testing.assert_array_equal(b["inputs"], ds.batch(0, 60)["inputs"])


def _ordered_pair_counts(draws: np.ndarray, population: int) -> np.ndarray:
    counts = np.zeros((population, population))
    np.add.at(counts, (draws[:, 0], draws[:, 1]), 1)
    return counts


@pytest.mark.parametrize("population", [6, 200])  # 6: the permutation path, 200: rejection
def test_distinct_uniform_is_uniform_over_ordered_tuples(population):
    rng = np.random.default_rng(3)
    rows = 60_000
    draws = mqar.distinct_uniform(rng, rows, population, 2 if population == 200 else 4)
    assert ((draws >= 0) & (draws < population)).all()
    assert (np.sort(draws, axis=1)[:, 1:] != np.sort(draws, axis=1)[:, :-1]).all()
    if population == 6:  # every ordered pair of the first two draws: 1 / (6 * 5)
        counts = _ordered_pair_counts(draws, population)
        expected = rows / (population * (population - 1))
        off = ~np.eye(population, dtype=bool)
        assert (np.abs(counts[off] - expected) < 5 * np.sqrt(expected)).all()
        assert counts[~off].sum() == 0
    else:  # each value's frequency in each position: 1 / 200
        for j in range(2):
            freq = np.bincount(draws[:, j], minlength=population)
            expected = rows / population
            assert (np.abs(freq - expected) < 5 * np.sqrt(expected)).all()


def test_distinct_weighted_follows_sequential_sampling():
    # P(first = a, second = b) = p_a p_b / (1 - p_a): drawing without replacement.
    p = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    rows = 80_000
    draws = mqar.distinct_weighted(np.random.default_rng(4), rows, p, 2)
    counts = _ordered_pair_counts(draws, len(p))
    exact = p[:, None] * p[None, :] / (1 - p[:, None])
    np.fill_diagonal(exact, 0.0)
    assert abs(exact.sum() - 1) < 1e-12
    sigma = np.sqrt(rows * exact * (1 - exact))
    assert (np.abs(counts - rows * exact) <= 5 * sigma + 1e-9).all()
    full = mqar.distinct_weighted(np.random.default_rng(5), 100, p, len(p))
    np.testing.assert_array_equal(np.sort(full, axis=1), np.tile(np.arange(len(p)), (100, 1)))
