"""layer_pattern: mixer names per layer or a repeating group, "N*name", "mixer" for
cfg.mixer, the old L/S letters, errors naming what is wrong; saved configs from before
short_conv and mixer-name patterns build the model they were; the recipe configs' layouts
are their references'."""
import json

import jax
import pytest
from flax import nnx

from models import LanguageModel, ModelConfig
from models.config import expand_layer_pattern


@pytest.mark.parametrize("pattern, num_layers, want", [
    ("base_conv,linear", 4, ["base_conv", "linear"] * 2),          # a repeating group
    ("softmax,linear,hedgehog", 3, ["softmax", "linear", "hedgehog"]),  # one per layer
    ("7*gated_deltanet,softmax", 16, (["gated_deltanet"] * 7 + ["softmax"]) * 2),
    (" base_conv , mixer ", 2, ["base_conv", "lightning"]),          # mixer = cfg.mixer
    ("LLS", 3, ["lightning", "lightning", "softmax"]),               # the old letters
    ("S", 1, ["softmax"]),
])
def test_patterns_expand(pattern, num_layers, want):
    assert expand_layer_pattern(pattern, num_layers, "lightning") == want
    cfg = ModelConfig(num_layers=num_layers, mixer="lightning", layer_pattern=pattern)
    assert cfg.layer_mixers() == want


def test_pattern_overrides_softmax_every_which_stays_a_shorthand():
    assert (ModelConfig(num_layers=8, mixer="gated_deltanet", softmax_every=8).layer_mixers()
            == ModelConfig(num_layers=8, layer_pattern="7*gated_deltanet,softmax")
            .layer_mixers())
    cfg = ModelConfig(num_layers=2, mixer="linear", softmax_every=2,
                      layer_pattern="base_conv,linear")
    assert cfg.layer_mixers() == ["base_conv", "linear"]


@pytest.mark.parametrize("pattern, match", [
    ("base_conv,mamba", r"layer_pattern.*unknown mixer 'mamba'; valid names: base_conv, based, "),
    ("linear,softmax,linear", r"names 3 layers, which neither equals nor divides "
                              r"num_layers=4"),
    ("linear,,softmax", "empty mixer name"),
    ("x*linear", r"'x\*linear': a repeat is a positive count"),
    ("0*linear,softmax", "a repeat is a positive count"),
    ("LLS", "one 'L' \\(mixer\\) or 'S' \\(softmax\\) per layer: 3 letters for "
            "num_layers=4"),
])
def test_bad_patterns_say_what_is_wrong(pattern, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(num_layers=4, layer_pattern=pattern)


# A checkpoint's config.json model section written before short_conv, base_conv_size and
# mixer-name patterns existed (keys of that time only), hybrid "LS".
OLD_SAVED = {
    "vocab_size": 50, "d_model": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 0,
    "head_dim": 0, "mixer": "linear", "softmax_every": 0, "layer_pattern": "LS",
    "mlp": True, "d_ff": 0, "dropout": 0.0, "attention_dropout": 0.0, "window": 64,
    "feature_map": "elu", "based_feature_dim": 16, "num_random_features": 256,
    "conv_size": 4, "impl": "chunk", "chunk_size": 64, "rope_theta": 10000.0,
    "max_len": 2048, "norm_eps": 1e-6, "init_std": 0.02, "dtype": "float32",
    "param_dtype": "float32", "remat": False, "tie_embeddings": False}


def _param_shapes(cfg):
    model = nnx.eval_shape(lambda: LanguageModel(cfg, rngs=nnx.Rngs(0)))
    return {"/".join(map(str, p)): v.shape
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_old_saved_config_builds_the_old_model(monkeypatch):
    from models import config as config_module
    cfg = ModelConfig.from_dict(json.loads(json.dumps(OLD_SAVED)))
    assert cfg.layer_mixers() == ["linear", "softmax"] and not cfg.short_conv
    shapes = _param_shapes(cfg)
    assert not [k for k in shapes if "conv" in k]
    # The model of that time: linear attention's q, k, v, o and softmax's, nothing more.
    want = {f"blocks/{i}/mixer/{p}_proj/kernel": (32, 32) for i in (0, 1) for p in "qkvo"}
    assert {k: v for k, v in shapes.items() if "/mixer/" in k} == want
    # SAVED_DEFAULTS, not today's default, fills the missing key: were the default to
    # become True, an old checkpoint would still build without the conv.
    monkeypatch.setattr(config_module.ModelConfig, "__init__",
                        _with_default(config_module.ModelConfig.__init__, short_conv=True))
    assert not ModelConfig.from_dict(OLD_SAVED).short_conv
    assert ModelConfig.from_dict({**OLD_SAVED, "short_conv": True}).short_conv


def _with_default(init, **defaults):
    def wrapped(self, **kwargs):
        init(self, **{**defaults, **kwargs})
    return wrapped


def test_letters_and_names_build_the_same_model():
    old = ModelConfig.from_dict(OLD_SAVED)
    new = ModelConfig.from_dict({**OLD_SAVED, "layer_pattern": "linear,softmax"})
    assert old.layer_mixers() == new.layer_mixers()
    a = LanguageModel(old, rngs=nnx.Rngs(0))
    b = LanguageModel(new, rngs=nnx.Rngs(0))
    la, lb = jax.tree.leaves(nnx.state(a, nnx.Param)), jax.tree.leaves(nnx.state(b, nnx.Param))
    assert len(la) == len(lb) and all(bool((x == y).all()) for x, y in zip(la, lb))


def _model_section(config_file, arg=None):
    import importlib.util
    spec = importlib.util.spec_from_file_location("_cfg", config_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config(arg) if arg else module.get_config()
    return ModelConfig.from_dict({**c.model.to_dict(), "vocab_size": 50})


def test_based_recipe_is_based_360m_layout():
    """HazyResearch/based train/configs/experiment/reference/based-360m.yaml: 27 layers,
    alt_mixer (Taylor linear attention) at 1, 6, 11, 16, 21, alt_mixer_2 (sliding window
    256) at 2, 7, 12, 17, 22, the BaseConv mixer everywhere else."""
    cfg = _model_section("configs/based_recipe.py", "360m")
    names = cfg.layer_mixers()
    assert len(names) == 27
    assert [i for i, n in enumerate(names) if n == "taylor"] == [1, 6, 11, 16, 21]
    assert [i for i, n in enumerate(names) if n == "sliding_window"] == [2, 7, 12, 17, 22]
    assert set(names) == {"taylor", "sliding_window", "gated_conv"}
    assert (cfg.d_model, cfg.num_heads, cfg.window, cfg.based_feature_dim, cfg.d_ff,
            cfg.gated_conv_expand, cfg.base_conv_size) == (1024, 16, 256, 16, 2048, 4, 3)
    small = _model_section("configs/based_recipe.py")
    assert small.layer_mixers()[:5] == ["gated_conv", "taylor", "sliding_window",
                                        "gated_conv", "gated_conv"]


def test_mqar_zoology_is_hybrid_base_conv_then_mixer():
    cfg = _model_section("configs/mqar_zoology.py")
    assert cfg.layer_mixers() == ["base_conv", "softmax"] and not cfg.mlp
    swept = ModelConfig.from_dict({**cfg.to_dict(), "mixer": "hedgehog", "num_layers": 4})
    assert swept.layer_mixers() == ["base_conv", "hedgehog"] * 2


def test_compare_mqar_zoology_sweeps_the_zoology_layout():
    from sweeps import grid
    from tests.eval.conftest import load_compare_config
    c = load_compare_config("compare_mqar", "zoology")
    assert c["base_config"] == "configs/mqar_zoology.py"
    runs = grid.expand_grid(c)
    assert len(runs) == 7 * 3 * 3  # mixers x lrs x seeds, at (256, 16) and d128
    assert {r["overrides"]["model.mixer"] for r in runs} >= {
        "linear", "hedgehog", "performer", "lightning"}
