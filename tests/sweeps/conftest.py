"""The tiny MQAR sweep the sweeps tests share (run once per session, in-process).

`mqar_sweep`: the grid of configs/compare_mqar.py:tiny restricted to softmax (two
learning rates, a few steps each), run through sweeps.runner.
"""
import pytest

from tests.eval.conftest import load_compare_config


@pytest.fixture(scope="session")
def mqar_sweep(tmp_path_factory):
    """(config, workdir, records, seconds) of the tiny MQAR sweep, softmax runs only."""
    import time

    from sweeps import runner

    cfg = load_compare_config("compare_mqar", "tiny")
    cfg["runner"] = "inprocess"
    workdir = tmp_path_factory.mktemp("mqar_sweep")
    t0 = time.time()
    records = runner.sweep(cfg, str(workdir), only="softmax", progress=False)
    return cfg, workdir, records, time.time() - t0
