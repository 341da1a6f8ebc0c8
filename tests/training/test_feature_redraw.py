"""Performer's feature redraw every N steps (model.performer_redraw_every): each layer's
omega is a pure function of (seed, layer, step // N), the same for every microbatch of a
step, and a run resumed mid-period trains on exactly the features it would have."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import LanguageModel
from tests.models.helpers import tiny_config as tiny_model_config
from tests.training.conftest import tiny_config
from training import builders, loop, metrics, model_state, runtime
from training import step as step_fns
from training import sharding as shd


def _omegas(model, steps: runtime.Steps, s: int, rng=None):
    """Every Performer layer's training-time omega at step s (rng: the dropout key)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    rng = steps.key(s) if rng is None else rng
    m = nnx.merge(graphdef, params, model_state.rekey(rest, rng, steps.feature_key(s)))
    return [np.asarray(block.mixer._omega(deterministic=False)) for block in m.blocks]


@pytest.mark.parametrize("n", [0, 1, 3, 100])
def test_keys_in_one_call_are_the_eager_fold_ins(n):
    """Steps.keys(s), what train.py's loop passes, is (fold_in(base, s), fold_in(base,
    s // N)) bit for bit, as the eager rule (and a population's traced one) makes them,
    so runs and resumes keep their dropout and feature draws."""
    base = jax.random.key(11)
    steps = runtime.Steps(None, None, base, n)
    for s in [0, 1, 2, 3, 7, 99, 100, 101, 12_345, 2**31 - 1]:
        key, feature_key = steps.keys(s)
        want_key = jax.random.fold_in(base, s)
        want_feature = jax.random.fold_in(base, s // max(n, 1))
        assert np.array_equal(jax.random.key_data(key), jax.random.key_data(want_key)), s
        assert np.array_equal(jax.random.key_data(feature_key),
                              jax.random.key_data(want_feature)), s
        assert np.array_equal(jax.random.key_data(steps.key(s)),
                              jax.random.key_data(want_key))


def test_features_change_exactly_when_step_over_n_does():
    n = 3
    model = LanguageModel(tiny_model_config(mixer="performer", num_layers=2,
                                            performer_redraw_every=n, scan_layers=False),
                          rngs=nnx.Rngs(0))
    steps = runtime.Steps(None, None, jax.random.key(5), n)
    draws = {s: _omegas(model, steps, s) for s in range(8)}
    for s in draws:
        for t in draws:
            same = all(np.array_equal(a, b) for a, b in zip(draws[s], draws[t]))
            assert same == (s // n == t // n), (s, t)
    # Each layer draws its own features; the dropout key plays no part in them.
    assert not np.array_equal(*draws[0])
    other = _omegas(model, steps, 4, rng=jax.random.key(99))
    assert all(np.array_equal(a, b) for a, b in zip(draws[4], other))
    # Period p's features are those every-step redraw (N = 1) draws at step p.
    every = runtime.Steps(None, None, jax.random.key(5), 1)
    assert all(np.array_equal(a, b) for a, b in zip(draws[7], _omegas(model, every, 2)))
    # And a fresh model (a resumed run) of the same seed draws them again.
    again = LanguageModel(tiny_model_config(mixer="performer", num_layers=2,
                                            performer_redraw_every=n, scan_layers=False),
                          rngs=nnx.Rngs(0))
    assert all(np.array_equal(a, b) for a, b in zip(draws[5], _omegas(again, steps, 5)))


PERFORMER = {"model.mixer": "performer", "model.num_random_features": 16}


def test_train_step_uses_the_period_draw_in_every_microbatch():
    """Two microbatches, a redraw every 2 steps: the jitted train step's loss on one
    batch moves only when step // 2 does, and equals the loss of the whole batch at once
    under the period's features (an eager reference): the microbatches share the draw."""
    config = tiny_config(**PERFORMER, **{"model.performer_redraw_every": 2,
                                         "train.grad_accum": 2})
    dataset = builders.build_dataset(config)
    mesh = runtime.make_mesh(config)
    model, layout = runtime.describe_model(
        config, builders.build_model_config(config, dataset), mesh)
    params, opt_state, rest = runtime.init_fresh(model, layout)
    steps = runtime.compile_steps(model, rest, layout, config.train, mesh,
                                  step_fns.Rows.of(dataset))
    host = dataset.batch(0, config.train.batch_size)
    batch = shd.global_batch(host, layout.batch)
    got = []
    for s in range(4):
        p, o = jax.tree.map(jnp.copy, (params, opt_state))  # the step donates them
        got.append(float(steps.train(p, o, batch, steps.key(s), steps.feature_key(s))[2]
                         ["loss"]))
    assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]

    parts = model_state.ModelParts(model.graphdef, model.template, rest, model.names,
                                   model.logical, model.shapes)
    for s in (0, 2):
        whole = parts.merge(params, model_state.rekey(rest, steps.key(s),
                                                      steps.feature_key(s)))
        total, count, _ = step_fns.loss_sums(whole, host, deterministic=False,
                                             packed=dataset.packed)
        assert got[s] == pytest.approx(float(total / count), rel=1e-5)


@pytest.mark.slow  # two training runs; the draw itself is checked by default
def test_resume_mid_period_gives_identical_losses(tmp_path):
    kw = {**PERFORMER, "model.performer_redraw_every": 3, "train.steps": 8,
          "train.checkpoint_every": 4}
    loop.train(tiny_config(**kw), str(tmp_path / "whole"))
    shutil.copytree(tmp_path / "whole", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "8")  # as if killed after step 4
    loop.train(tiny_config(**kw), str(tmp_path / "killed"))  # step 4 is mid-period [3, 6)

    def losses(workdir):
        return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}
    assert losses(tmp_path / "killed") == losses(tmp_path / "whole")
    assert sorted(losses(tmp_path / "whole")) == list(range(1, 9))
