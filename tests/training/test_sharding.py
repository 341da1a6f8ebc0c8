"""Mesh sizes, logical-axis rules and their fallbacks, global batches (one device here;
the 8-device equivalence test lives in test_distributed.py)."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

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
