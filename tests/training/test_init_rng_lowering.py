"""training.model_state's init: one compiled program for every seed, whose threefry draws
lower to jax's GPU kernel (the same bits; jit(init) of an 8-layer d1024 model compiled
in 4.8 s against 73 s on the H200) within a context that leaves jax's flag as it was.
On the CPU the flag changes nothing, so the values must equal a jitted init outside it
(the H200 check of the same: docs/benchmarks.md, session 15)."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import ModelConfig
from training import builders, model_state
from training import sharding as shd

FLAG = "jax_threefry_gpu_kernel_lowering"


def test_context_restores_the_flag():
    before = getattr(jax.config, FLAG)
    with model_state.threefry_as_gpu_kernel():
        assert getattr(jax.config, FLAG) is True
    assert getattr(jax.config, FLAG) == before
    try:
        with model_state.threefry_as_gpu_kernel():
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert getattr(jax.config, FLAG) == before


def test_seeded_init_equals_the_model_built_in_a_plain_jit():
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=2, mixer="gated_deltanet",
                      vocab_size=64)
    make = builders.seeded_model_factory(cfg)
    _, _, _, _, logical, shapes = model_state.describe(lambda: make(0))
    mesh = shd.make_mesh(1, 1, 1)
    init = model_state.seeded_init(make, shd.param_shardings(logical, shapes, mesh),
                                   shd.replicated(mesh))
    plain = jax.jit(
        lambda s: model_state.flat_params(nnx.split(make(s), nnx.Param, ...)[1]))
    for seed in (0, 5):
        got, _ = init(seed)
        want = plain(jnp.int32(seed))
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(np.asarray(got[name]),
                                          np.asarray(jnp.asarray(want[name])), err_msg=name)
