"""ModelConfig: defaults, derived sizes, hybrid layer layout and user errors."""
import pytest

from models import ModelConfig


def test_defaults_and_derived_sizes():
    c = ModelConfig(d_model=384, num_heads=6)
    assert c.resolved_head_dim == 64 and c.resolved_kv_heads == 6
    assert c.resolved_d_ff == 1024  # 8/3 * 384 rounded up to a multiple of 32
    assert ModelConfig(d_model=32).resolved_d_ff == 96
    assert ModelConfig(d_ff=100).resolved_d_ff == 100


def test_one_in_eight_hybrid_and_pattern_override():
    c = ModelConfig(num_layers=16, mixer="gated_deltanet", softmax_every=8)
    names = c.layer_mixers()
    assert [i for i, n in enumerate(names) if n == "softmax"] == [7, 15]
    assert set(names) == {"gated_deltanet", "softmax"}
    p = ModelConfig(num_layers=3, mixer="linear", softmax_every=8, layer_pattern="SLS")
    assert p.layer_mixers() == ["softmax", "linear", "softmax"]


def test_from_dict_roundtrip_and_types():
    c = ModelConfig(mixer="based", d_model=64, dropout=0.1, remat=True)
    assert ModelConfig.from_dict(c.to_dict()) == c
    assert ModelConfig.from_dict({"rope_theta": 500000}).rope_theta == 500000.0
    with pytest.raises(ValueError, match="num_layers.*must be int"):
        ModelConfig.from_dict({"num_layers": "4"})
    with pytest.raises(ValueError, match="remat.*must be bool"):
        ModelConfig.from_dict({"remat": 1})


def test_from_dict_unknown_key_suggests_nearest():
    with pytest.raises(ValueError, match="num_head.*Did you mean num_heads"):
        ModelConfig.from_dict({"num_head": 4})
    with pytest.raises(ValueError, match="'windw'.*window"):
        ModelConfig.from_dict({"windw": 4})


@pytest.mark.parametrize("kwargs, match", [
    ({"d_model": 30, "num_heads": 4}, "num_heads"),
    ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
    ({"num_layers": 2, "layer_pattern": "LLS"}, "layer_pattern"),
    ({"num_layers": 2, "layer_pattern": "LX"}, "layer_pattern"),
    ({"dtype": "fp8"}, "dtype.*choose one of"),
    ({"param_dtype": "fp8"}, "param_dtype.*choose one of"),
    ({"impl": "fast"}, "impl.*choose one of"),
    ({"window_impl": "dense"}, "window_impl.*choose one of"),
    ({"conv_impl": "fft"}, "conv_impl.*choose one of"),
    ({"feature_map": "cos"}, "feature_map.*choose one of"),
])
def test_bad_values_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


def test_unknown_mixer_lists_valid_names():
    from flax import nnx
    from models import LanguageModel, get_mixer
    with pytest.raises(ValueError, match="gated_deltanet.*softmax"):
        get_mixer("gated_delta")
    with pytest.raises(ValueError, match="Unknown mixer 'mamba'"):
        LanguageModel(ModelConfig(mixer="mamba", d_model=32, num_heads=2, num_layers=1,
                                  vocab_size=10), rngs=nnx.Rngs(0))


def test_runtime_keys_are_marked_on_the_fields():
    # How a model is computed, not what it is: a resume may change these.
    # scan_layers: the loader converts checkpoints between the two layouts;
    # performer_redraw_every: how often the random features are redrawn, not a weight;
    # window_impl / conv_impl: which kernel computes the sliding window / the delta
    # rules' conv path (the same function); hedgehog_distill: a training loss's weight,
    # like dropout; mask_every_head, attention_max_segments: the form in which packed
    # documents reach cuDNN (a mask, or its packed-sequence layout).
    assert ModelConfig.runtime_keys() == {"dtype", "remat", "remat_policy", "impl",
                                          "chunk_size", "max_len", "dropout", "scan_layers",
                                          "performer_redraw_every", "window_impl",
                                          "conv_impl", "hedgehog_distill", "mask_every_head",
                                          "attention_max_segments"}


def test_base_config_model_section_is_model_config_defaults():
    """configs/base.py states no default of its own: only vocab_size 0 (the dataset's)."""
    from configs import base
    section = base.get_config().model.to_dict()
    want = {**ModelConfig().to_dict(), "vocab_size": 0}
    assert section == want
    assert {k: type(v) for k, v in section.items()} == {k: type(v) for k, v in want.items()}
