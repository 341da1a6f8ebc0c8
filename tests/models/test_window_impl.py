"""model.window_impl reaches the sliding-window kernel: the banded and the masked (T x T)
forms, two independent computations, give the same layer output; a bad name is refused."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import ModelConfig
from models.mixers import get_mixer


@pytest.mark.parametrize("mixer", ["sliding_window", "based"])
def test_window_impls_agree_inside_the_mixer(mixer):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 40, 32), jnp.float32)
    segment_ids = (jnp.arange(40) >= 17).astype(jnp.int32)[None].repeat(2, 0)
    outs = {}
    for impl in ("blocked", "masked"):
        cfg = ModelConfig(d_model=32, num_heads=2, mixer=mixer, window=8, window_impl=impl,
                          based_feature_dim=4)
        layer = get_mixer(mixer)(cfg, rngs=nnx.Rngs(3))
        outs[impl] = np.asarray(layer(x, segment_ids=segment_ids))
    np.testing.assert_allclose(outs["blocked"], outs["masked"], rtol=1e-5, atol=1e-6)
    assert np.abs(outs["masked"]).max() > 1e-3


def test_unknown_window_impl_is_refused():
    with pytest.raises(ValueError, match="window_impl"):
        ModelConfig(window_impl="flash")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN is there")
def test_cudnn_window_impl_is_what_runs():
    """The setting reaches the kernel: asking for cuDNN where there is none fails."""
    cfg = ModelConfig(d_model=32, num_heads=2, mixer="sliding_window", window=8,
                      window_impl="cudnn")
    layer = get_mixer("sliding_window")(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(Exception, match="(?i)cudnn"):
        layer(jnp.ones((1, 40, 32)))
