"""scripts/state_memory.py over 8 simulated CPU devices: the bytes it reads from the
shardings train.py gives the state equal each device's shards of the state as a run
builds it, and under FSDP the parameters and the optimizer state each device holds fall
as 1/N (issue 23's memory criterion, checked on the shardings)."""
import json
import subprocess
import sys

import pytest

from tests.training.conftest import ROOT, env

MESHES = ["8x1x1", "2x4x1", "1x8x1", "2x2x2"]


@pytest.mark.parametrize("mixer", ["softmax", "gated_deltanet"])
def test_fsdp_splits_parameters_and_optimizer_state_evenly(mixer):
    r = subprocess.run(
        [sys.executable, "scripts/state_memory.py", "--check", "--json",
         f"--meshes={','.join(MESHES)}", f"model.mixer={mixer}", "model.d_model=128",
         "model.num_layers=2", "model.mlp=True", "train.batch_size=16"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=env(XLA_FLAGS="--xla_force_host_platform_device_count=8"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["mesh"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert list(rows) == MESHES
    total, params = rows["8x1x1"]["total"], rows["8x1x1"]["params"]
    # AdamW: float32 parameters, two float32 moments of the same shapes, two int32 counts
    assert total == 3 * params + 8
    for mesh, row in rows.items():
        data, fsdp, tensor = map(int, mesh.split("x"))
        assert row["total"] == total and row["params"] == params
        # the figures read from the shardings are what a run's devices hold
        assert row["placed_max"] == row["per_device"], mesh
        if fsdp * tensor == 1:  # data parallel: every device holds everything
            assert row["per_device"] == total and row["replicated"] == total
            continue
        split = fsdp * tensor
        # every array but a few small vectors is split over all of fsdp x tensor
        assert row["replicated"] < 0.01 * total, mesh
        assert row["params_per_device"] <= 1.1 * params / split, mesh
        assert row["per_device"] <= 1.1 * total / split, mesh
