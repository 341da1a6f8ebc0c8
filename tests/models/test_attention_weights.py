"""Mixer.attention_weights: where a mixer says it has attention weights, they are its own:
applied to its values and taken through its output path they give its output (packed
documents, the exponential maps' running-max stabiliser and FAVOR+'s feature eps
included), rows sum to 1, and a query sees no later key and no key of another document. Elsewhere
(has_attention_weights False) asking for them raises."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.mixers import MIXERS, get_mixer
from models.mixers.feature_attention import FeatureMapAttention
from tests.models.helpers import tiny_config

T = 20
SEGMENTS = np.array([[0] * 7 + [1] * 13, [0] * 20], np.int32)

CASES = {  # name: (mixer, config overrides)
    "linear elu+1": ("linear", {}),
    "linear relu, short conv": ("linear", {"feature_map": "relu", "short_conv": True}),
    "linear dpfp": ("linear", {"feature_map": "dpfp"}),
    "performer": ("performer", {}),
    "hedgehog softmax map, rope": ("hedgehog", {"feature_rope": True}),
    "hedgehog exp map": ("hedgehog", {"hedgehog_map": "exp"}),
    "taylor": ("taylor", {}),
    "hedgehog_window": ("hedgehog_window", {}),
}


def _apply_weights(mixer, a, x, segment_ids):
    """The mixer's output from weights a (B, H, T, T): A v through its own output path."""
    if isinstance(mixer, FeatureMapAttention):
        inputs, _ = mixer._inputs(x, segment_ids=segment_ids, conv_state=None)
        o = jnp.einsum("bhts,bshd->bthd", a, inputs["v"].astype(jnp.float32))
        return mixer._output(o.astype(inputs["v"].dtype), x, inputs)
    v = mixer.v_proj(x).reshape(x.shape[:2] + (mixer.num_heads, mixer.head_dim))
    o = jnp.einsum("bhts,bshd->bthd", a, v.astype(jnp.float32))
    return mixer.o_proj(o.reshape(o.shape[:2] + (-1,)))


@pytest.mark.parametrize("case", list(CASES))
def test_weights_give_the_mixers_output(case):
    name, overrides = CASES[case]
    cfg = tiny_config(mixer=name, **overrides)
    cls = get_mixer(name)
    assert cls.has_attention_weights(cfg)
    mixer = cls(cfg, rngs=nnx.Rngs(1))
    # the op's o = num / (den + eps): an eps far below any den here, so that the output is
    # the weights' exactly (a document's first token has den = one key's product)
    mixer.denominator_eps = 1e-30
    x = jax.random.normal(jax.random.key(2), (2, T, cfg.d_model), jnp.float32)
    with jax.default_matmul_precision("highest"):
        a = np.asarray(mixer.attention_weights(x, SEGMENTS))
        y = np.asarray(mixer(x, segment_ids=SEGMENTS))
        again = np.asarray(_apply_weights(mixer, jnp.asarray(a), x, SEGMENTS))
    assert a.shape == (2, cfg.num_heads, T, T)
    # rows sum to 1; a query whose features meet no visible key's (relu and DPFP can
    # give exact zeros) has none, and the mixer's output there is 0 as well
    sums = a.sum(-1)
    assert np.all(np.isclose(sums, 1.0, atol=1e-5) | (sums == 0)), sums
    assert np.mean(sums == 0) < 0.1
    query, key = np.arange(T)[:, None], np.arange(T)[None, :]
    visible = (key <= query) & (SEGMENTS[:, :, None] == SEGMENTS[:, None, :])
    assert np.all(a[~np.broadcast_to(visible[:, None], a.shape)] == 0)
    np.testing.assert_allclose(again, y, atol=1e-5 * max(1.0, np.abs(y).max()))


def test_mixers_without_weights_say_so():
    cfg = tiny_config(mixer="linear", feature_map="identity")
    assert not get_mixer("linear").has_attention_weights(cfg)
    mixer = get_mixer("linear")(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="no attention weights"):
        mixer.attention_weights(jnp.zeros((1, 4, cfg.d_model)))
    with_weights = {n for n, cls in MIXERS.items()
                    if cls.has_attention_weights(tiny_config(mixer=n))}
    assert with_weights == {"linear", "performer", "hedgehog", "taylor", "hedgehog_window"}
    cfg = tiny_config(mixer="gated_deltanet")
    with pytest.raises(NotImplementedError, match="no attention weights"):
        get_mixer("gated_deltanet")(cfg, rngs=nnx.Rngs(0)).attention_weights(
            jnp.zeros((1, 4, cfg.d_model)))
