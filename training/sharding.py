"""Device mesh, logical-axis rules for parameters, and global batches.

The mesh has three axes, always in this order:
  data   - pure data parallelism (parameters replicated),
  fsdp   - data parallelism with parameters and optimizer state sharded (ZeRO-3 style),
  tensor - tensor parallelism inside matmuls.
Parameters carry logical axis names ("embed", "vocab", "mlp", "heads", "kv", "norm",
and "layers" for the stacked axis of scanned layers);
`LOGICAL_RULES` maps them to mesh axes, as MaxText does. A dimension that does not divide
by its mesh axis size is replicated instead, so any model runs on any mesh.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both data axes

LOGICAL_RULES: dict[str, str | None] = {
    "embed": "fsdp",
    "vocab": "tensor",
    "mlp": "tensor",
    "heads": "tensor",
    "kv": None,
    "norm": None,
    # The stacked layer axis of scan_layers (models.layer_stack): never split, so each
    # scan step reads a whole layer from its own shards.
    "layers": None,
}


class MeshError(ValueError):
    pass


def mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
    """Resolves one -1 to "the rest of the devices" and checks the product."""
    sizes = [int(data), int(fsdp), int(tensor)]
    if sizes.count(-1) > 1:
        raise MeshError(f"mesh {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise MeshError(f"mesh {dict(zip(MESH_AXES, sizes))}: sizes must be positive or -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise MeshError(f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices "
                            f"do not divide by {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise MeshError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} "
                        f"devices but {num_devices} are available; set mesh.data=-1 to use "
                        f"the rest")
    return tuple(sizes)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(data, fsdp, tensor, len(devices))
    try:
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    except Exception:  # CPU / odd topologies: a plain reshape is fine
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def logical_to_spec(logical: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, str | None] = LOGICAL_RULES) -> P:
    """PartitionSpec for one array: map names by `rules`; replicate a dimension whose size
    does not divide by its mesh axis, an axis of size 1, or a mesh axis already used."""
    if not logical:
        return P()
    used, spec = set(), []
    for name, size in zip(logical, shape):
        axis = rules.get(name) if name is not None else None
        if (axis is None or axis in used or mesh.shape[axis] == 1
            or size % mesh.shape[axis] != 0):
            spec.append(None)
        else:
            spec.append(axis)
            used.add(axis)
    spec += [None] * (len(shape) - len(spec))
    return P(*spec)


def param_shardings(logical_specs: Mapping[str, Sequence[str | None] | None],
                    shapes: Mapping[str, Sequence[int]],
                    mesh: Mesh) -> dict[str, NamedSharding]:
    """{name: NamedSharding} for a flat dict of parameters."""
    return {k: NamedSharding(mesh, logical_to_spec(logical_specs.get(k), shapes[k], mesh))
            for k in shapes}


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def check_batch_divides(batch_size: int, mesh: Mesh,
                        what: str = "train.batch_size") -> None:
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % n:
        raise MeshError(f"{what}={batch_size} must be a multiple of mesh data x fsdp = {n} "
                        f"(each data-parallel shard gets an equal slice)")


def global_batch(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict:
    """A global jax.Array per field from the host batch. Each process copies only the rows
    its own devices hold (`make_array_from_callback` asks for exactly those), so the same
    code runs on one process or many, whatever the device order of the mesh."""
    out = {}
    for name, value in batch.items():
        value = np.asarray(value)
        out[name] = jax.make_array_from_callback(value.shape, sharding,
                                                 lambda idx, v=value: v[idx])
    return out
