"""Config checking: wrong keys and types stop early with the nearest valid keys."""
import json
import subprocess
import sys

import pytest

from tests.training.conftest import ROOT, env
from training import config_tools


@pytest.fixture(scope="module")
def config():
    return config_tools.load_config_file(str(ROOT / "configs" / "mqar.py"))


def test_unknown_key_suggests_nearest(config):
    with pytest.raises(config_tools.ConfigError) as e:
        config_tools.check_overrides(config, {"train.lrr": "0.1"})
    assert "'train.lrr'" in str(e.value) and "train.lr" in str(e.value)
    with pytest.raises(config_tools.ConfigError, match="model.mixer"):
        config_tools.check_overrides(config, {"model.mixr": "gated_deltanet"})
    # A right leaf in the wrong section.
    with pytest.raises(config_tools.ConfigError, match="train.batch_size"):
        config_tools.check_overrides(config, {"batch_size": "3"})


def test_wrong_type_names_key_and_expected_type(config):
    with pytest.raises(config_tools.ConfigError, match=r"train\.steps.*integer"):
        config_tools.check_overrides(config, {"train.steps": "many"})
    with pytest.raises(config_tools.ConfigError, match=r"train\.lr.*number"):
        config_tools.check_overrides(config, {"train.lr": "fast"})
    with pytest.raises(config_tools.ConfigError, match="boolean"):
        config_tools.check_overrides(config, {"model.mlp": "maybe"})
    # Valid values of each type pass, placeholders (None defaults) included.
    config_tools.check_overrides(config, {"train.steps": "5", "train.lr": "1e-3",
                                          "model.mlp": "true", "data.files": "a.txt",
                                          "train.precision": "bfloat16"})


def test_argv_parsing_forms():
    path, o = config_tools.overrides_from_argv(
        ["--config=configs/mqar.py", "--workdir=x", "--config.train.lr=0.1",
         "--config.model.mixer", "softmax", "--config.train.remat"])
    assert path == "configs/mqar.py"
    assert o == {"train.lr": "0.1", "model.mixer": "softmax", "train.remat": "true"}


def test_save_and_load_roundtrip(config, tmp_path):
    config_tools.save_config(config, tmp_path)
    back = config_tools.load_config(tmp_path)
    assert config_tools.flat_keys(back) == json.loads(json.dumps(config_tools.flat_keys(
        config.to_dict()), default=list))
    assert back.model.mixer == config.model.mixer


def test_vocab_filled_from_dataset_and_precision(config):
    d = config_tools.model_config_dict(config, vocab_size=512)
    assert d["vocab_size"] == 512 and d["dtype"] == "float32"
    c = config_tools.load_config_file(str(ROOT / "configs" / "mqar.py"))
    c.train.precision = "bfloat16"
    c.model.vocab_size = 100
    with pytest.raises(config_tools.ConfigError, match="model.vocab_size"):
        config_tools.model_config_dict(c, vocab_size=512)
    c.model.vocab_size = 0
    assert config_tools.model_config_dict(c, 512)["dtype"] == "bfloat16"


@pytest.mark.parametrize("arg, expect", [
    ("--config.train.lrr=0.1", "did you mean train.lr"),
    ("--config.train.steps=ten", "expected an integer"),
])
def test_cli_rejects_bad_override_before_building(tmp_path, arg, expect):
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config=configs/mqar.py",
                        f"--workdir={tmp_path / 'w'}", arg], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert expect in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists()  # nothing was built or written


def test_set_values_sets_dotted_keys_in_place():
    config = config_tools.load_config_file(str(ROOT / "configs" / "mqar.py"))
    config_tools.set_values(config, {"train.lr": 0.5, "model.mixer": "linear"})
    assert config.train.lr == 0.5 and config.model.mixer == "linear"


def test_config_with_overrides_reads_values_as_the_keys_types():
    """The scripts' SECTION.KEY=VALUE overrides: each value read as its key's declared
    type (booleans as train.py's flags read them, tuples and untyped keys as literals, a
    placeholder's None default by its declared type), checked as train.py checks them."""
    mqar = str(ROOT / "configs" / "mqar.py")
    c = config_tools.config_with_overrides(
        mqar, ["model.d_model=32", "train.lr=1e-3", "model.mlp=true", "train.remat=0",
               "model.mixer=gated_deltanet", "data.files=a.txt", "data.val_fraction=0.25",
               "data.num_kv_pairs=[[64, 4, 1]]"])
    assert (c.model.d_model, c.train.lr, c.model.mlp, c.train.remat, c.model.mixer,
            c.data.files, c.data.val_fraction, c.data.num_kv_pairs) == (
        32, 1e-3, True, False, "gated_deltanet", "a.txt", 0.25, [[64, 4, 1]])
    assert config_tools.config_with_overrides(mqar, ["model.mlp=False"]).model.mlp is False
    for bad, message in [("model.mixer=no_such_mixer", "mixer"),
                         ("train.lrr=0.1", "train.lr"),
                         ("train.steps=ten", "integer"),
                         ("model.mlp=maybe", "boolean"),
                         ("train.steps", "KEY=VALUE")]:
        with pytest.raises(config_tools.ConfigError, match=message):
            config_tools.config_with_overrides(mqar, [bad])
