"""FLOP counts against worked examples and nanoGPT's estimate_mfu formula."""
import pytest

from training import flops


def test_softmax_model_matches_nanogpt_formula():
    # nanoGPT: flops_per_token = 6 N + 12 L H Q T (H heads of width Q, context T).
    model = {"d_model": 128, "num_heads": 4, "num_layers": 4, "mixer": "softmax"}
    n, t = 800_000, 64
    assert flops.train_flops_per_token(n, model, t) == 6 * n + 12 * 4 * 4 * 32 * t


def test_linear_mixer_cost_is_4_h_f_dv_per_layer():
    model = {"d_model": 64, "num_heads": 2, "num_layers": 2, "mixer": "gated_deltanet"}
    # Per layer per token: 4 * H * F * Dv with F = Dv = 32; independent of T.
    per_layer = 4 * 2 * 32 * 32
    for t in (64, 4096):
        assert flops.train_flops_per_token(1000, model, t) == 3 * (2 * 1000 + 2 * per_layer)
    based = {"d_model": 64, "num_heads": 2, "num_layers": 1, "mixer": "based", "window": 16,
             "based_feature_dim": 16}
    f = 1 + 16 + 16 * 17 // 2  # the distinct Taylor features (models.feature_maps)
    assert flops.mixer_flops_per_token("based", based, 64) == 4 * 2 * f * 32 + 4 * 16 * 2 * 32


def test_hybrid_layers_and_mfu():
    model = {"d_model": 64, "num_heads": 2, "num_layers": 8, "mixer": "gated_deltanet",
             "softmax_every": 8}
    assert flops.layer_kinds(model) == ["gated_deltanet"] * 7 + ["softmax"]
    assert flops.layer_kinds({**model, "layer_pattern": "SLLLLLLL"})[0] == "softmax"
    assert flops.mfu(1000.0, 1e6, 2, 1e10) == pytest.approx(0.05)
    assert flops.peak_flops_per_device() == flops.CPU_NOMINAL_PEAK  # this machine
