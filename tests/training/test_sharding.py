"""Mesh sizes, logical-axis rules and their fallbacks, global batches (one device here,
8 simulated ones in a subprocess for the one-process batch; the 8-device training
equivalence test lives in test_distributed.py)."""
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.training.conftest import ROOT, env
from training import sharding as shd


def test_mesh_shape_resolves_minus_one():
    assert shd.mesh_shape(-1, 1, 1, 8) == (8, 1, 1)
    assert shd.mesh_shape(-1, 2, 1, 8) == (4, 2, 1)
    assert shd.mesh_shape(2, 2, -1, 8) == (2, 2, 2)
    with pytest.raises(shd.MeshError, match="needs 4 devices but 8"):
        shd.mesh_shape(2, 2, 1, 8)
    with pytest.raises(shd.MeshError, match="do not divide"):
        shd.mesh_shape(-1, 3, 1, 8)
    with pytest.raises(shd.MeshError, match="at most one"):
        shd.mesh_shape(-1, -1, 1, 8)


class FakeMesh:
    """Only .shape is read by logical_to_spec: lets us test an 8-device layout on 1 CPU."""
    def __init__(self, data, fsdp, tensor):
        self.shape = {"data": data, "fsdp": fsdp, "tensor": tensor}


def test_logical_rules_and_fallbacks():
    mesh = FakeMesh(2, 2, 2)
    assert shd.logical_to_spec(("embed", "mlp"), (64, 128), mesh) == P("fsdp", "tensor")
    assert shd.logical_to_spec(("vocab", "embed"), (100, 64), mesh) == P("tensor", "fsdp")
    # 65 rows do not divide by tensor=2: that dimension is replicated, not an error.
    assert shd.logical_to_spec(("vocab", "embed"), (65, 64), mesh) == P(None, "fsdp")
    # kv / norm / unnamed dimensions stay replicated; one mesh axis is used once.
    assert shd.logical_to_spec(("embed", "heads", "kv"), (64, 4, 16), mesh) == P(
        "fsdp", "tensor", None)
    assert shd.logical_to_spec(("heads", "mlp"), (4, 8), mesh) == P("tensor", None)
    assert shd.logical_to_spec(("norm",), (64,), mesh) == P(None)
    assert shd.logical_to_spec(None, (3, 3), mesh) == P()
    # An axis of size 1 shards nothing.
    assert shd.logical_to_spec(("embed", "mlp"), (64, 128),
                               FakeMesh(8, 1, 1)) == P(None, None)


def test_global_batch_matches_host_batch_and_checks_divisibility():
    mesh = shd.make_mesh(-1, 1, 1)
    b = {"inputs": np.arange(12, dtype=np.int32).reshape(4, 3)}
    g = shd.global_batch(b, shd.batch_sharding(mesh))
    np.testing.assert_array_equal(np.asarray(g["inputs"]), b["inputs"])
    assert g["inputs"].sharding.spec == P(("data", "fsdp"))
    with pytest.raises(shd.MeshError, match="multiple of mesh data x fsdp"):
        shd.check_batch_divides(3, FakeMesh(2, 1, 1))



ONE_PROCESS_BATCH = """
import jax, numpy as np
from training import sharding as shd
mesh = shd.make_mesh(-1, 1, 1, sequence=2)          # data 4 x sequence 2
sharding = shd.batch_sharding(mesh)
rows, t = 8, 8
local = {"inputs": np.arange(rows * t, dtype=np.int32).reshape(rows, t),
         "mask": np.arange(rows * t).reshape(rows, t) % 3 > 0,
         "extra": np.arange(rows * t * 2, dtype=np.float32).reshape(rows, t, 2)}
got = shd.global_batch_from_process_data(local, sharding, (rows, t))
for name, value in local.items():
    want = jax.make_array_from_process_local_data(sharding, value, value.shape)
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want))
    assert got[name].sharding.is_equivalent_to(want.sharding, value.ndim), name
    for a, b in zip(got[name].addressable_shards, want.addressable_shards):
        assert a.device == b.device and a.index == b.index, name
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
try:
    shd.global_batch_from_process_data({"inputs": local["inputs"][:, :4]}, sharding,
                                       (rows, t))
except ValueError as e:
    assert "'inputs' has shape" in str(e), e
else:
    raise AssertionError("a field of the wrong shape was accepted")
print("ok")
"""


def test_one_process_batch_is_the_per_field_process_local_arrays():
    """On one process the batch's fields go in one device_put: the same shards on the
    same devices as make_array_from_process_local_data field by field (the multi-process
    path), over 8 simulated devices with a sequence axis; a field whose leading
    dimensions are not the batch's is refused."""
    r = subprocess.run([sys.executable, "-c", ONE_PROCESS_BATCH], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env=env(XLA_FLAGS="--xla_force_host_platform_device_count=8"))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
