"""Device mesh, logical-axis rules for parameters, and global batches.

The mesh has four axes, always in this order:
  data     - pure data parallelism (parameters replicated),
  fsdp     - data parallelism with parameters and optimizer state sharded (ZeRO-3 style),
  tensor   - tensor parallelism inside matmuls,
  sequence - context parallelism: each sequence split along time, the mixers passing
             states (kernels.context_parallel); 1 unless mesh.sequence says otherwise.
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

MESH_AXES = ("data", "fsdp", "tensor", "sequence")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both data axes
SEQUENCE_AXIS = "sequence"     # the time dimension of a batch, over mesh.sequence devices

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


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None,
              sequence: int = 1) -> Mesh:
    """data x fsdp x tensor x sequence; sequence takes its devices first (it must divide
    their number), the other three share the rest as mesh_shape says. The sequence axis
    is last, so a piece's neighbours in time are neighbouring devices."""
    devices = list(jax.devices() if devices is None else devices)
    sequence = int(sequence)
    if sequence < 1 or len(devices) % sequence:
        raise MeshError(f"mesh.sequence={sequence} must be a positive divisor of the "
                        f"{len(devices)} devices")
    try:
        shape = mesh_shape(data, fsdp, tensor, len(devices) // sequence) + (sequence,)
    except MeshError as e:
        if sequence == 1:
            raise
        raise MeshError(f"{e} (mesh.sequence={sequence} holds {len(devices)} / {sequence} "
                        f"of them for each)") from None
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


def batch_spec(mesh: Mesh, leading: tuple = ()) -> P:
    """(batch, time) arrays: rows over data x fsdp, time over the sequence axis when it has
    more than one device; `leading` dims (e.g. grad_accum's microbatch axis) in front."""
    if mesh.shape.get(SEQUENCE_AXIS, 1) > 1:
        return P(*leading, BATCH_AXES, SEQUENCE_AXIS)
    return P(*leading, BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(mesh))


def check_sequence_divides(seq_len: int, mesh: Mesh, what: str = "data.seq_len") -> None:
    n = mesh.shape.get(SEQUENCE_AXIS, 1)
    if seq_len % n:
        raise MeshError(f"{what}={seq_len} must be a multiple of mesh.sequence = {n} "
                        f"(each device takes an equal piece of every sequence)")


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


# ------------------------------------------- each process's share of a global batch
def process_indices(sharding: NamedSharding, global_shape: Sequence[int], *,
                    devices_indices=None, process_of=None, process_index: int | None = None
                    ) -> tuple[np.ndarray, ...]:
    """Per dimension, the global indices of the block of a `global_shape` array that this
    process's devices hold, in the order `jax.make_array_from_process_local_data` reads
    its local data: the process's distinct shard slices sorted by start, concatenated.
    A dimension the process holds whole is arange(size). On one process: every index.

    devices_indices, process_of, process_index (for tests): a {device: index tuple} map
    of all devices (default `sharding.devices_indices_map(global_shape)`), a device's
    process (default its process_index) and the process asked about (default this one)."""
    global_shape = tuple(int(n) for n in global_shape)
    if devices_indices is None:
        devices_indices = sharding.devices_indices_map(global_shape)
    pid = jax.process_index() if process_index is None else process_index
    if process_of is None:
        process_of = lambda d: d.process_index  # noqa: E731
    out = []
    for dim, size in enumerate(global_shape):
        starts, width = set(), None
        for device, index in devices_indices.items():
            if process_of(device) != pid:
                continue
            sl = index[dim] if dim < len(index) else slice(None)
            lo, hi, _ = sl.indices(size)
            starts.add(lo)
            width = hi - lo
        if width is None:
            raise MeshError(f"process {pid} holds no device of the mesh")
        starts = sorted(starts)
        if len(starts) * width == size:  # held whole (possibly out of order): in order
            out.append(np.arange(size, dtype=np.int64))
        else:
            out.append(np.concatenate([np.arange(s, s + width, dtype=np.int64)
                                       for s in starts]))
    return tuple(out)


def process_rows(sharding: NamedSharding, global_shape: Sequence[int]) -> np.ndarray:
    """The batch rows (dimension 0) this process reads: see process_indices."""
    return process_indices(sharding, global_shape)[0]


def global_batch_from_process_data(local: Mapping[str, np.ndarray], sharding: NamedSharding,
                                   global_shape: Sequence[int]) -> dict:
    """A global jax.Array per field of `global_shape` (leading dims; a field's trailing
    dims are its own) from this process's rows (`process_rows`, read by the data source
    from its pure function of (seed, step)): `jax.make_array_from_process_local_data`, or
    on one process, which holds the whole batch, one `jax.device_put` of every field.
    Dimensions past the rows that this process does not hold whole (a sequence axis over
    processes) are cut from the local rows here."""
    local = {name: np.asarray(value) for name, value in local.items()}
    if jax.process_count() == 1:  # the whole batch: one transfer for every field (half
        # the host time of one make_array_from_process_local_data call per field)
        for name, value in local.items():
            if value.shape[:len(global_shape)] != tuple(global_shape):
                raise ValueError(f"batch field {name!r} has shape {value.shape}, not "
                                 f"{tuple(global_shape)} in its leading dimensions")
        return jax.device_put(local, sharding)
    out = {}
    for name, value in local.items():
        shape = tuple(global_shape) + value.shape[len(global_shape):]
        idx = process_indices(sharding, shape)
        for dim in range(1, value.ndim):
            if len(idx[dim]) != shape[dim]:
                value = np.take(value, idx[dim], axis=dim)
        out[name] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out
