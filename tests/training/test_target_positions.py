"""training.step.loss_sums forming logits only at the loss's positions
(data.Dataset.targets_per_row), as MQAR's steps do.

The sums and every parameter's gradient equal those of the loss over all positions
(float32, CPU) on real MQAR batches of one setting, of several kv counts and of Zoology's
mixture of settings (weighted masks), also through the chunked loss; target_positions
against a NumPy gather; and the promise itself: no MQAR row of any mode or split has more
loss positions than its dataset's targets_per_row.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import data
from data import mixture
from models import LanguageModel, ModelConfig
from training import step as step_fns

MQAR_CASES = {
    "one setting": {"seq_len": 64, "num_kv_pairs": 8},
    "kv choices": {"seq_len": 64, "num_kv_pairs": [2, 4, 8]},
    "settings mixture": {"seq_len": 64, "num_kv_pairs": [[32, 2, 1], [64, 8, 1]]},
    "random filler": {"seq_len": 48, "num_kv_pairs": 4, "random_non_queries": True},
}


def _mqar(case, seed=0):
    return data.build(dict(MQAR_CASES[case], source="mqar", vocab_size=128), seed=seed)


def _model(mixer):
    cfg = ModelConfig(vocab_size=128, d_model=32, num_layers=2, num_heads=2, mixer=mixer,
                      dtype="float32", max_len=64)
    return LanguageModel(cfg, rngs=nnx.Rngs(0))


def _sums_and_grads(model, batch, **kw):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def total(p):
        s, n, c = step_fns.loss_sums(nnx.merge(graphdef, p, rest), batch,
                                     deterministic=True, packed=False, **kw)
        return s, (n, c)
    (s, (n, c)), g = jax.jit(jax.value_and_grad(total, has_aux=True))(params)
    return np.array([float(s), float(n), float(c)]), g


@pytest.mark.parametrize("case,mixer,chunk_logits", [
    ("one setting", "softmax", step_fns.LOSS_CHUNK_LOGITS),
    ("kv choices", "gated_deltanet", step_fns.LOSS_CHUNK_LOGITS),
    ("settings mixture", "softmax", step_fns.LOSS_CHUNK_LOGITS),
    ("settings mixture", "gated_deltanet", 128 * 6 * 3),  # gathered logits in pieces
])
def test_logits_at_the_targets_equal_the_full_loss(case, mixer, chunk_logits):
    ds = _mqar(case)
    batch = {k: jnp.asarray(v) for k, v in ds.batch(3, 6).items()}
    model = _model(mixer)
    ref, g_ref = _sums_and_grads(model, batch, chunk_logits=10 ** 9)
    got, g_got = _sums_and_grads(model, batch, chunk_logits=chunk_logits,
                                 targets_per_row=ds.targets_per_row)
    assert ref[1] > 0
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_got), strict=True):
        a, b = np.asarray(a), np.asarray(b)  # float32 sums in another order
        assert np.max(np.abs(b - a)) <= 1e-5 * np.max(np.abs(a)) + 1e-9


def test_target_positions_is_a_gather_of_the_masked_positions_in_order():
    rng = np.random.default_rng(0)
    b, t, k = 5, 17, 6
    mask = np.zeros((b, t), np.float32)
    for r, n in enumerate([0, 1, 3, 6, 6]):  # fewer than k and exactly k
        mask[r, np.sort(rng.choice(t, n, replace=False))] = rng.uniform(0.1, 1, n)
    x = rng.normal(size=(b, t, 3)).astype(np.float32)
    targets = rng.integers(0, 50, (b, t))
    gx, gt, gm = step_fns.target_positions(jnp.asarray(x), jnp.asarray(targets),
                                           jnp.asarray(mask), k)
    for r in range(b):
        where = np.nonzero(mask[r])[0]
        n = len(where)
        np.testing.assert_array_equal(np.asarray(gx)[r, :n], x[r, where])
        np.testing.assert_array_equal(np.asarray(gt)[r, :n], targets[r, where])
        np.testing.assert_array_equal(np.asarray(gm)[r, :n], mask[r, where])
        assert np.all(np.asarray(gm)[r, n:] == 0)  # the rest: positions of mask 0


@pytest.mark.parametrize("case", sorted(MQAR_CASES))
def test_no_mqar_row_has_more_targets_than_promised(case):
    ds = _mqar(case, seed=3)
    bound = ds.targets_per_row
    assert bound < ds.seq_len
    for split in ("train", "val"):
        for step in range(4):
            mask = ds.batch(step, 64, split)["mask"]
            assert (mask != 0).sum(axis=1).max() <= bound
    # and every bound is reached by some row: no larger than it need be
    mask = ds.batch(0, 256)["mask"]
    assert (mask != 0).sum(axis=1).max() == bound


def test_text_sources_and_mixtures_with_text_promise_nothing(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be " * 200)
    files = {"source": "files", "files": str(text), "seq_len": 32}
    assert data.build(files, seed=0).targets_per_row is None
    mqar = {"source": "mqar", "num_kv_pairs": 4, "vocab_size": 64}
    with_text = data.build({"source": "mixture", "seq_len": 32, "components": {
        "text": dict(files, weight=1.0), "mqar": dict(mqar, weight=1.0)}}, seed=0)
    assert isinstance(with_text, mixture.MixtureDataset)
    assert with_text.targets_per_row is None
    only_mqar = data.build({"source": "mixture", "seq_len": 32, "components": {
        "a": dict(mqar, weight=1.0), "b": dict(mqar, num_kv_pairs=2, weight=1.0)}}, seed=0)
    assert only_mqar.targets_per_row == 4


def test_train_loop_losses_equal_those_of_the_full_loss(tmp_path, monkeypatch):
    """train.py's loop (configs/mqar.py, tiny) reaches the bound through the dataset: its
    losses and eval accuracies equal those of the same run with no bound."""
    from data import mqar
    from tests.training.conftest import tiny_config
    from training import loop, metrics

    kw = {"train.steps": 6, "train.eval_every": 3, "train.checkpoint_every": 0}

    def logged(workdir):
        return [(e["step"], e.get("loss"), e.get("eval_accuracy"))
                for e in metrics.read_metrics(workdir)]
    ds = data.build(tiny_config().data.to_dict(), seed=0)
    assert ds.targets_per_row < ds.seq_len  # the bound is taken
    loop.train(tiny_config(**kw), str(tmp_path / "bound"))
    monkeypatch.setattr(mqar.MQARDataset, "targets_per_row", property(lambda self: None))
    loop.train(tiny_config(**kw), str(tmp_path / "full"))
    bound, full = logged(tmp_path / "bound"), logged(tmp_path / "full")
    assert [e[0] for e in bound] == [e[0] for e in full] and len(bound) >= 6
    for (_, lb, ab), (_, lf, af) in zip(bound, full):
        assert (lb is None) == (lf is None) and (ab is None) == (af is None)
        if lb is not None:
            assert abs(lb - lf) <= 1e-5 * abs(lf)
        if ab is not None:
            assert ab == af
