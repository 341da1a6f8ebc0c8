"""Every sweep config's lrs and seeds can be replaced from the command line, as a re-run
with new seeds or one lr of a grid needs (`--config.seeds="(3,4,5)"`): ml_collections
overrides tuples, not lists, so the axes must be tuples in every config and variant."""
import pytest

from sweeps import grid
from tests.conftest import ROOT
from tests.training.conftest import config_from_command_line
from training import config_tools

SWEEPS = [("compare_mqar.py", v) for v in ("", "reduced", "h200", "zoology", "tiny")] + [
    ("compare_mqar_zoology.py", v) for v in ("paper", "based", "tiny", "based_tiny")] + [
    ("compare_niah.py", v) for v in ("", "tiny", "ruler", "ruler_tiny")] + [
    ("compare_shakespeare.py", v) for v in ("", "tiny", "seeds")]


@pytest.mark.parametrize("path,variant", SWEEPS,
                         ids=[f"{p[:-3]}:{v or 'default'}" for p, v in SWEEPS])
def test_lrs_and_seeds_are_replaced_from_the_command_line(path, variant, monkeypatch):
    config = f"{ROOT / 'configs' / path}" + (f":{variant}" if variant else "")
    # sweeps.run parses its config as train.py does: the overrides' precheck, then
    # config_flags
    cfg = config_tools.to_plain(config_from_command_line(
        ["sweeps/run.py", f"--config={config}", "--config.lrs=(0.0125,0.5)",
         "--config.seeds=(7,8,9)"], monkeypatch))
    runs = grid.expand_grid(cfg)
    assert {r["lr"] for r in runs} == {0.0125, 0.5}
    assert {r["seed"] for r in runs} == {7, 8, 9}
    for r in runs:  # the run's own overrides carry them, and its name
        assert r["overrides"][cfg["lr_key"]] == r["lr"]
        assert r["overrides"][cfg["seed_key"]] == r["seed"]
        assert f"lr{r['lr']:g}" in r["name"] and r["name"].endswith(f"s{r['seed']}")
