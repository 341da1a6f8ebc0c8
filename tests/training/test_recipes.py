"""The published recipes reach their numbers (marked slow: each trains a whole recipe).

    python -m pytest -q -m slow tests/training/test_recipes.py
"""
import re
import sys

import pytest

from tests.conftest import SHAKESPEARE
from tests.training.conftest import ROOT, run_cli

FINAL = re.compile(r"final: step (\d+) eval_loss ([\d.]+) eval_accuracy ([\d.]+)")


def final_line(args, timeout):
    r = run_cli(args, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    m = FINAL.search(r.stdout)
    assert m, r.stdout
    return int(m.group(1)), float(m.group(2)), float(m.group(3))


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["softmax", "gated_deltanet"])
def test_mqar_main_job_reaches_95_percent(tmp_path, mixer):
    step, _, accuracy = final_line(
        [sys.executable, str(ROOT / "train.py"), "--config=configs/mqar.py",
         f"--workdir={tmp_path}", f"--config.model.mixer={mixer}",
         "--config.logging.wandb=disabled"], timeout=3600)
    assert accuracy >= 0.95, (mixer, step, accuracy)


@pytest.mark.slow
def test_shakespeare_char_cpu_recipe_reaches_nanogpt_val_loss(tmp_path):
    if not SHAKESPEARE.exists():
        pytest.skip(f"{SHAKESPEARE} not present")
    _, val_loss, _ = final_line(
        [sys.executable, str(ROOT / "train.py"), "--config=configs/shakespeare_char.py",
         f"--workdir={tmp_path}", f"--config.data.files={SHAKESPEARE}",
         "--config.logging.wandb=disabled"], timeout=3600)
    assert val_loss <= 1.90
