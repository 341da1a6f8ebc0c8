"""Every config key the README and data/__init__.py document is declared in
configs/base.py (so --config.KEY works on any experiment file), settable from the command
line with its documented form, and checked before anything runs."""
import re

import pytest

import data
from configs import base
from tests.training.conftest import ROOT, config_from_command_line
from training import builders, config_tools

SECTIONS = ("model", "data", "train", "mesh", "logging")


def readme_keys() -> set[str]:
    """Every `section.key` the README names; train.py and modules of the repository
    (`python -m data.prepare`) are not keys."""
    text = (ROOT / "README.md").read_text()
    found = re.findall(rf"\b((?:{'|'.join(SECTIONS)})\.[a-z_]+)", text)

    def is_module(name):
        section, leaf = name.split(".")
        return (leaf == "py" or (ROOT / section / f"{leaf}.py").exists()
                or (ROOT / section / leaf).is_dir())
    return {k for k in found if not is_module(k)}


def data_package_keys() -> set[str]:
    """The key column of data/__init__.py's "Config keys" table: a line indented by two
    spaces, its keys ("files / name", "packing, val_fraction, seq_len") then a gap."""
    doc = data.__doc__
    table = doc[doc.index("Config keys"):doc.index("Held-out data")]
    keys = set()
    for line in table.splitlines():
        m = re.match(r"^  ([a-z_][a-z_ ,/]*?)(?:\s{2,}|$)", line)
        if m:
            keys |= {k.strip() for k in re.split(r"[,/]", m.group(1))}
    return {"data." + k for k in keys if k}


def test_the_parsers_find_the_documented_keys():
    # Against the text as written: a parser that found nothing would pass anything.
    assert {"model.performer_redraw_every", "train.prng_impl", "mesh.tensor",
            "logging.wandb", "data.tokenizer"} <= readme_keys()
    assert {"data.power_a", "data.niah_depths", "data.filler_source", "data.components",
            "data.random_non_queries", "data.files", "data.name",
            "data.val_fraction"} <= data_package_keys()


def test_every_documented_key_is_declared_in_base():
    declared = set(config_tools.flat_keys(base.get_config()))
    missing = sorted((readme_keys() | data_package_keys()) - declared)
    assert missing == [], f"documented but not in configs/base.py: {missing}"


def test_task_keys_settable_from_the_command_line(monkeypatch):
    """NIAH's list of depths and MQAR's power law from the command line, on a config
    file that sets neither, reach the dataset."""
    argv = ["train.py", f"--config={ROOT / 'configs/mqar.py'}",
            "--config.data.source=niah", "--config.data.niah_depths=[0.25,0.75]",
            "--config.data.niah_kind=multikey", "--config.data.num_keys=2",
            "--config.data.key_len=2", "--config.data.seq_len=96",
            "--config.data.power_a=0.2", "--config.data.mqar_vocab_size=128"]
    c = config_from_command_line(argv, monkeypatch)
    assert c.data.niah_depths == [0.25, 0.75] and c.data.power_a == 0.2
    config_tools.check_config(c)
    d = builders.build_dataset(c)
    assert list(d.depths) == [0.25, 0.75] and d.kind == "multikey" and d.num_keys == 2
    assert d.key_len == 2
    c.unlock()
    c.data.source = "mqar"
    c.data.seq_len = 32
    d = builders.build_dataset(c)
    assert d.power_a == 0.2 and d.task_vocab == 128


@pytest.mark.parametrize("key, value, expect", [
    ("data.power_a", 0.0, "data.power_a=0.0: use a positive number"),
    ("data.niah_kind", "haystack", "data.niah_kind='haystack': use one of passkey, "
                                   "multikey"),
    ("data.niah_depths", [0.5, 1.5], "data.niah_depths=[0.5, 1.5]: use a list of "
                                     "fractions in [0, 1]"),
    ("data.niah_depths", 0.5, "data.niah_depths=0.5: use a list"),
    ("data.num_keys", 0, "data.num_keys=0: use a positive integer"),
    ("data.num_digits", -1, "data.num_digits=-1: use a positive integer"),
    ("data.filler_source", "web", "data.filler_source='web': use one of files, hf, tfds"),
    ("data.components", "text", "data.components='text': use a list of sub-configs"),
])
def test_impossible_task_values_are_named(key, value, expect):
    config = config_tools.load_config_file(str(ROOT / "configs" / "mqar.py"))
    config_tools.set_values(config, {key: value})
    with pytest.raises(config_tools.ConfigError) as e:
        config_tools.check_config(config)
    assert expect in str(e.value) and "\n" not in str(e.value)
