"""Orbax checkpoints: exact round trip, incomplete saves ignored, wrong model named."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from training import checkpoint


def _state(width=4):
    params = {"layers/0/kernel": jnp.arange(4.0 * width).reshape(4, width),
              "norm/scale": jnp.ones(width)}
    tx = optax.adamw(1e-3)
    opt = tx.init(params)
    opt = jax.tree.map(lambda x: x + 1 if x.dtype == jnp.float32 else x, opt)
    return params, opt


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def test_roundtrip_and_keep_last_k(tmp_path):
    params, opt = _state()
    ck = checkpoint.Checkpointer(tmp_path, keep=2)
    for step in (2, 4, 6):
        ck.save(step, jax.tree.map(lambda x: x * step, params), opt,
                {"step": step, "data_position": step,
                 "config": {"model": {"mixer": "softmax"}}},
                force=True)
    ck.wait()
    assert ck.all_steps() == [4, 6] and ck.latest_step() == 6
    p, o, meta = ck.restore(6, _abstract(params), _abstract(opt))
    ck.close()
    for k in params:
        np.testing.assert_array_equal(np.asarray(p[k]), np.asarray(params[k]) * 6)
    assert jax.tree.structure(o) == jax.tree.structure(opt)
    for a, b in zip(jax.tree.leaves(o), jax.tree.leaves(opt)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert meta["data_position"] == 6


def test_incomplete_save_is_ignored(tmp_path):
    """A kill during a save leaves orbax's tmp directory: restore uses the step before."""
    params, opt = _state()
    ck = checkpoint.Checkpointer(tmp_path, async_save=False)
    ck.save(3, params, opt, {"step": 3}, force=True)
    ck.close()
    # What an interrupted save of step 4 leaves behind (orbax writes, then renames).
    partial = tmp_path / checkpoint.CHECKPOINT_DIR / "4.orbax-checkpoint-tmp-1796000000"
    (partial / "params").mkdir(parents=True)
    (partial / "params" / "garbage").write_bytes(b"\0" * 100)
    ck = checkpoint.Checkpointer(tmp_path)
    assert ck.latest_step() == 3 and ck.all_steps() == [3]
    p, _, _ = ck.restore(ck.latest_step(), _abstract(params))
    ck.close()
    np.testing.assert_array_equal(np.asarray(p["norm/scale"]), np.ones(4))


def test_mismatch_names_the_parameter(tmp_path):
    params, opt = _state(width=4)
    ck = checkpoint.Checkpointer(tmp_path, async_save=False)
    ck.save(1, params, opt, {"step": 1, "config": {"model": {"d_model": 4}}}, force=True)
    wider = {k: v.shape[:-1] + (8,) for k, v in params.items()}
    with pytest.raises(checkpoint.CheckpointMismatch) as e:
        ck.check_compatible(1, wider, {"d_model": 8})
    msg = str(e.value)
    assert "'layers/0/kernel' has shape (4, 4) in the checkpoint but (4, 8)" in msg
    assert "model.d_model=4 there, 8 here" in msg
    other = {"layers/0/mixer/A_log": (2,), "norm/scale": (4,)}
    with pytest.raises(checkpoint.CheckpointMismatch,
                       match="'layers/0/mixer/A_log'.*not in the"):
        ck.check_compatible(1, other)
    # The right model passes.
    ck.check_compatible(1, {k: v.shape for k, v in params.items()})
    ck.close()


def test_layouts_are_compared_as_the_layers_they_build(tmp_path):
    """A resume whose layer pattern is spelt another way but builds the same layers is
    accepted; one that builds other layers is refused, naming both."""
    params, opt = _state()
    shapes = {k: v.shape for k, v in params.items()}
    saved = {"mixer": "linear", "num_layers": 4, "layer_pattern": "LLLS",
             "softmax_every": 0, "d_model": 4}
    ck = checkpoint.Checkpointer(tmp_path, async_save=False)
    ck.save(1, params, opt, {"step": 1, "config": {"model": saved}}, force=True)
    for same in ({"layer_pattern": "3*mixer,softmax"},
                 {"layer_pattern": "linear,linear,linear,softmax", "mixer": "deltanet"},
                 {"layer_pattern": "", "softmax_every": 4}):
        ck.check_compatible(1, shapes, {**saved, **same})
    with pytest.raises(checkpoint.CheckpointMismatch) as e:
        ck.check_compatible(1, shapes, {**saved, "layer_pattern": "mixer,softmax"})
    msg = str(e.value)
    assert ("has the layers ['linear', 'linear', 'linear', 'softmax'] (model.layer_pattern="
            "'LLLS'" in msg)
    assert "this config builds ['linear', 'softmax', 'linear', 'softmax']" in msg
    with pytest.raises(checkpoint.CheckpointMismatch, match="model.mixer='linear'"):
        ck.check_compatible(1, shapes, {**saved, "layer_pattern": "3*mixer,softmax",
                                        "mixer": "deltanet"})
    with pytest.raises(checkpoint.CheckpointMismatch, match="model.d_model=4"):
        ck.check_compatible(1, shapes, {**saved, "d_model": 8})  # other keys still count
    ck.close()
