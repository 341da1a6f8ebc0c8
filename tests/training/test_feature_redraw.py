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
from training import sharding as shd


def _omegas(model, steps: runtime.Steps, s: int, rng=None):
    """Every Performer layer's training-time omega at step s (rng: the dropout key)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    rng = steps.key(s) if rng is None else rng
    m = nnx.merge(graphdef, params, model_state.rekey(rest, rng, steps.feature_key(s)))
    return [np.asarray(block.mixer._omega(deterministic=False)) for block in m.blocks]


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


def _train_step_losses(config, step_indices):
    """The train step's loss on batch 0 at each step index (one compile): only the keys
    of the step change."""
    dataset = builders.build_dataset(config)
    mesh = runtime.make_mesh(config)
    model, layout = runtime.describe_model(
        config, builders.build_model_config(config, dataset), mesh)
    params, opt_state, rest = runtime.init_fresh(model, layout)
    steps = runtime.compile_steps(model, rest, layout, config.train, mesh, dataset.packed)
    batch = shd.global_batch(dataset.batch(0, config.train.batch_size), layout.batch)
    out = []
    for s in step_indices:
        p, o = jax.tree.map(jnp.copy, (params, opt_state))  # the step donates them
        out.append(float(steps.train(p, o, batch, steps.key(s), steps.feature_key(s))[2]
                         ["loss"]))
    return out


PERFORMER = {"model.mixer": "performer", "model.num_random_features": 16}


def test_train_step_uses_the_period_draw_in_every_microbatch():
    kw = {**PERFORMER, "model.performer_redraw_every": 2}
    one = _train_step_losses(tiny_config(**kw), [0, 1, 2, 3])
    # Through the jitted train step: the loss moves only when step // 2 does.
    assert one[0] == one[1] and one[2] == one[3] and one[0] != one[2]
    # Two microbatches use the step's draw too: the loss of one big batch.
    two = _train_step_losses(tiny_config(**kw, **{"train.grad_accum": 2}), [0, 2])
    assert two == pytest.approx([one[0], one[2]], rel=1e-5)


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
