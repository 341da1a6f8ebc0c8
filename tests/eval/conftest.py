"""Tiny trained workdirs shared by the eval tests (trained once per session, in-process).

`text_run`: a 1-layer gated_deltanet byte-level LM trained a few dozen steps on a small
generated ASCII corpus (no download, no ../shared). `mqar_run`: one run of the tiny MQAR
grid of configs/compare_mqar.py:tiny (softmax, lr 3e-2, a few steps).
"""
import importlib.util
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def corpus_text(n_lines: int = 600, seed: int = 0) -> str:
    """Deterministic English-like ASCII text with enough structure to learn bigrams from."""
    rng = np.random.default_rng(seed)
    words = ("the king shall speak of love and war to all his men while the queen "
             "waits in the tower for news from the north").split()
    lines = [" ".join(rng.choice(words, size=rng.integers(4, 10))) for _ in range(n_lines)]
    return "\n".join(lines) + "\n"


def load_compare_config(name: str, arg: str = "") -> dict:
    spec = importlib.util.spec_from_file_location(f"_cmp_{name}",
                                                  ROOT / "configs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg).to_dict()


@pytest.fixture(scope="session")
def text_run(tmp_path_factory):
    from sweeps import runner

    d = tmp_path_factory.mktemp("text_run")
    corpus = d / "corpus.txt"
    corpus.write_text(corpus_text())
    workdir = d / "run"
    cfg = {"base_config": "configs/base.py"}
    run = {"name": "text", "overrides": {
        "data.files": str(corpus), "data.seq_len": 32, "data.tokenizer": "byte",
        "model.mixer": "gated_deltanet", "model.d_model": 32, "model.num_heads": 2,
        "model.num_layers": 1, "model.mlp": False,
        "train.steps": 30, "train.batch_size": 8, "train.lr": 1e-2, "train.warmup_steps": 5,
        "train.eval_every": 0, "train.eval_batches": 2, "train.checkpoint_every": 0,
        "train.log_every": 20, "logging.wandb": "disabled", "logging.progress": False}}
    runner.train_inprocess(cfg, run, str(workdir))
    return workdir


@pytest.fixture(scope="session")
def mqar_run(tmp_path_factory):
    """The workdir of compare_mqar:tiny's softmax run at lr 3e-2, trained in-process."""
    from sweeps import grid, runner

    cfg = load_compare_config("compare_mqar", "tiny")
    (run,) = [r for r in grid.expand_grid(cfg)
              if r["name"].endswith("softmax__d16__lr0.03__s0")]
    workdir = tmp_path_factory.mktemp("mqar_run") / run["name"]
    runner.train_inprocess(cfg, run, str(workdir))
    return workdir
