"""FLOPs per token: every mixer's count against a hand count of the cost model (seed
000's: softmax 4 T H D, a recurrent state 4 H F Dv), the counts following
based_feature_dim, num_random_features and the feature map, and the model totals
(nanoGPT's formula, the hybrid's layers, LanguageModel.flops_per_token)."""
import dataclasses

import jax
import pytest
from flax import nnx

from models import MIXERS, LanguageModel, ModelConfig, flops, get_mixer

# d_model 32, 2 heads of 16; T = 48 runs past the window of 16, T = 8 stays inside it.
SMALL = dict(vocab_size=50, d_model=32, num_heads=2, num_layers=2, window=16,
             based_feature_dim=4, num_random_features=24)
H, D = 2, 16


def _hand_flops(name, cfg, t):
    """Forward mixing FLOPs per token, written out per mixer."""
    w = min(t, cfg.window)                # keys a sliding-window query sees
    f = cfg.based_feature_dim
    taylor = 1 + f + f * (f + 1) // 2     # Based's distinct Taylor features
    linear_f = {"dpfp": 2 * D}.get(cfg.feature_map, D)
    return {
        "softmax": 4 * t * H * D,         # 2 D for q . k and 2 D for p v, per key and head
        "sliding_window": 4 * w * H * D,
        "linear": 4 * H * linear_f * D,   # state write 2 F Dv and read 2 F Dv, per head
        "performer": 4 * H * cfg.num_random_features * D,
        "hedgehog": 4 * H * (2 * D) * D,
        "taylor": 4 * H * taylor * D,
        "based": 4 * H * taylor * D + 4 * w * H * D,
        "hedgehog_window": 4 * H * (2 * D) * D + 4 * w * H * D,  # hedgehog's + the window's
        "base_conv": 0,                   # its conv and projection are weights, counted there
        "gated_conv": 0,
        "gated_deltanet": 4 * H * D * D,
        "deltanet": 4 * H * D * D,
        "lightning": 4 * H * D * D,
    }[name]


def mixer_flops(name, t=48, **overrides):
    return get_mixer(name).flops_per_token(ModelConfig(**{**SMALL, **overrides}), t)


@pytest.mark.parametrize("t", [8, 48])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixer_flops_match_hand_count(name, t):
    cfg = ModelConfig(**SMALL)
    assert get_mixer(name).flops_per_token(cfg, t) == _hand_flops(name, cfg, t)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "identity", "dpfp"])
def test_linear_flops_per_feature_map(feature_map):
    cfg = ModelConfig(**SMALL, feature_map=feature_map)
    assert get_mixer("linear").flops_per_token(cfg, 48) == _hand_flops("linear", cfg, 48)


def test_flops_follow_the_feature_counts():
    """Each change moves the count by exactly 4 H (F' - F) Dv."""
    # Based: 1 + f + f (f + 1) / 2 Taylor features, 153 at f = 16 and 561 at f = 32.
    assert (mixer_flops("based", based_feature_dim=32)
            - mixer_flops("based", based_feature_dim=16) == 4 * H * (561 - 153) * D)
    # Performer: F = m random features.
    assert (mixer_flops("performer", num_random_features=1024)
            - mixer_flops("performer", num_random_features=64) == 4 * H * (1024 - 64) * D)
    # DPFP: F = 2 d, twice elu+1's d.
    assert (mixer_flops("linear", feature_map="dpfp")
            - mixer_flops("linear", feature_map="elu") == 4 * H * (2 * D - D) * D)


def test_softmax_model_matches_nanogpt_formula():
    # nanoGPT: flops_per_token = 6 N + 12 L H Q T (H heads of width Q, context T).
    cfg = ModelConfig(d_model=128, num_heads=4, num_layers=4, mixer="softmax")
    n, t = 800_000, 64
    assert flops.train_flops_per_token(cfg, n, t) == 6 * n + 12 * 4 * 4 * 32 * t


def test_linear_mixer_cost_is_4_h_f_dv_per_layer():
    cfg = ModelConfig(d_model=64, num_heads=2, num_layers=2, mixer="gated_deltanet")
    # Per layer per token: 4 * H * F * Dv with F = Dv = 32; independent of T.
    per_layer = 4 * 2 * 32 * 32
    for t in (64, 4096):
        assert flops.train_flops_per_token(cfg, 1000, t) == 3 * (2 * 1000 + 2 * per_layer)
    based = dict(d_model=64, num_heads=2, num_layers=1, mixer="based", window=16)
    for k in (16, 32):  # 16 is no special value: 32 gives its own count
        cfg = ModelConfig(**based, based_feature_dim=k)
        f = 1 + k + k * (k + 1) // 2  # the distinct Taylor features (models.feature_maps)
        assert (get_mixer("based").flops_per_token(cfg, 64)
                == 4 * 2 * f * 32 + 4 * 16 * 2 * 32)


def test_hybrid_counts_each_layer_as_its_mixer():
    cfg = ModelConfig(d_model=64, num_heads=2, num_layers=8, mixer="gated_deltanet",
                      softmax_every=8)
    assert cfg.layer_mixers() == ["gated_deltanet"] * 7 + ["softmax"]
    moved = dataclasses.replace(cfg, layer_pattern="SLLLLLLL")
    assert moved.layer_mixers()[0] == "softmax"
    t, n = 256, 1000
    gdn, softmax = 4 * 2 * 32 * 32, 4 * t * 2 * 32
    assert flops.train_flops_per_token(cfg, n, t) == 3 * (2 * n + 7 * gdn + softmax)
    assert (flops.train_flops_per_token(moved, n, t)
            == flops.train_flops_per_token(cfg, n, t))


def test_language_model_counts_its_own_parameters():
    cfg = ModelConfig(**{**SMALL, "num_layers": 2, "layer_pattern": "LS", "mixer": "based"})
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    n = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    t = 48
    assert model.flops_per_token(t) == (2 * n + _hand_flops("based", cfg, t)
                                        + _hand_flops("softmax", cfg, t))
