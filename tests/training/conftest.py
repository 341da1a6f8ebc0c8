"""Helpers for the training tests: a tiny MQAR config and a CLI runner."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def config_from_command_line(argv: list[str], monkeypatch):
    """The config train.py would get from `argv` (["train.py", "--config=...", ...]): the
    precheck of its overrides, then ml_collections' config_flags, which reads sys.argv."""
    from absl import flags
    from ml_collections import config_flags

    from training import config_tools
    path, overrides = config_tools.overrides_from_argv(argv[1:])
    config_tools.check_overrides(config_tools.load_config_file(path), overrides)
    monkeypatch.setattr(sys, "argv", argv)
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
    fv(argv)
    return fv.config


# The smallest model and task that still exercise every piece (two layers, multi-head,
# packed MQAR sequences): the tests train it many times, on CPU.
TINY = {
    "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2,
    "data.seq_len": 16, "data.num_kv_pairs": 2, "data.vocab_size": 64,
    "train.steps": 12, "train.batch_size": 8, "train.lr": 3e-3, "train.warmup_steps": 2,
    "train.log_every": 1, "train.eval_every": 0, "train.eval_batches": 2,
    "train.checkpoint_every": 4, "logging.wandb": "disabled", "logging.progress": False,
}


def tiny_config(**overrides):
    """The mqar config shrunk to TINY, then `overrides` (dotted keys) applied."""
    from training import config_tools
    c = config_tools.load_config_file(str(ROOT / "configs" / "mqar.py"))
    base = dict(TINY)
    base.update(overrides)
    config_tools.set_values(c, base)
    return c


def cli_args(config_overrides: dict, workdir) -> list[str]:
    """train.py arguments for the tiny config."""
    base = dict(TINY)
    base.update(config_overrides)
    return ([sys.executable, str(ROOT / "train.py"),
             "--config=" + str(ROOT / "configs/mqar.py"), f"--workdir={workdir}"]
            + [f"--config.{k}={v}" for k, v in base.items()])


def env(**extra):
    """The environment of a train.py subprocess: the test session's XLA flags (see
    tests/conftest.py) before any `XLA_FLAGS` given here, none of the caller's."""
    from tests.conftest import TEST_XLA_FLAGS
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)
    flags = " ".join(f for f in (TEST_XLA_FLAGS, extra.pop("XLA_FLAGS", "")) if f)
    if flags:
        e["XLA_FLAGS"] = flags
    e["PYTHONPATH"] = str(ROOT)
    e["WANDB_MODE"] = "disabled"
    e.update(extra)
    return e


def run_cli(args, timeout=300, **extra_env):
    return subprocess.run(args, cwd=ROOT, env=env(**extra_env), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def tiny():
    return tiny_config
