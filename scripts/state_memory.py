"""Bytes of parameters and optimizer state that each device holds, for a train.py config
on one or more meshes: what data parallelism replicates and FSDP / tensor parallelism
split (issue 23: under FSDP the memory per GPU for both should fall as 1/N).

    python scripts/state_memory.py --config configs/lm_files.py \\
        --meshes 8x1x1,4x2x1,2x4x1,1x8x1 data.files=input.txt model.d_model=1024 ...

A mesh is DATAxFSDPxTENSOR over that many devices; on a CPU, simulate them with
XLA_FLAGS=--xla_force_host_platform_device_count=8. Read from the shapes and the
shardings train.py gives them (training.runtime.describe_model), nothing is allocated,
so a model larger than the machine can be planned. --check also builds the state
(training.runtime.init_fresh, as a run starts) and compares each device's shards with
the figures. Prints one row a mesh: the total, the most any device holds, that against
total / (fsdp x tensor), and the bytes no mesh axis splits (every device holds them).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from training import builders, config_tools, runtime  # noqa: E402


def _leaf_pairs(shapes, shardings):
    """(ShapeDtypeStruct, sharding) of every array of a state and its shardings' tree."""
    is_shape = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731
    shapes = jax.tree_util.tree_leaves(shapes, is_leaf=is_shape)
    shardings = jax.tree_util.tree_leaves(shardings)
    if len(shapes) != len(shardings):
        raise ValueError(f"{len(shapes)} state arrays against {len(shardings)} shardings")
    return list(zip(shapes, shardings))


def describe(config):
    """(the model and its layout on the config's mesh, the mesh), as a run sets them up."""
    mesh = runtime.make_mesh(config)
    dataset = builders.build_dataset(config)
    model_cfg = builders.build_model_config(config, dataset)
    model, layout = runtime.describe_model(config, model_cfg, mesh)
    return model, layout, mesh


def _bytes(pairs) -> dict:
    total = replicated = per_device = 0
    for shape, sharding in pairs:
        itemsize = shape.dtype.itemsize
        total += math.prod(shape.shape) * itemsize
        per_device += math.prod(sharding.shard_shape(shape.shape)) * itemsize
        if sharding.is_fully_replicated:
            replicated += math.prod(shape.shape) * itemsize
    return {"total": total, "per_device": per_device, "replicated": replicated}


def state_bytes(model, layout) -> dict:
    """{"total", "per_device" (what each device holds: a mesh splits every array evenly),
    "replicated" (bytes of the arrays no mesh axis splits)} of the parameters and
    optimizer state together, and "params" / "params_per_device" of the parameters
    alone."""
    both = _bytes(_leaf_pairs((model.params, model.opt_state),
                              (layout.params, layout.opt_state)))
    params = _bytes(_leaf_pairs(model.params, layout.params))
    return {**both, "params": params["total"], "params_per_device": params["per_device"]}


def placed_bytes(model, layout) -> dict[int, int]:
    """Bytes of each device's shards of a freshly built state (device id -> bytes)."""
    params, opt_state, _ = runtime.init_fresh(model, layout)
    held = collections.Counter()
    for leaf in jax.tree_util.tree_leaves((params, opt_state)):
        for shard in leaf.addressable_shards:
            held[shard.device.id] += shard.data.nbytes
    return dict(held)


def parse_mesh(text: str) -> dict[str, int]:
    try:
        data, fsdp, tensor = (int(n) for n in text.split("x"))
    except ValueError:
        raise SystemExit(f"--meshes: {text!r} is not DATAxFSDPxTENSOR (e.g. 4x2x1)")
    return {"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/mqar.py")
    ap.add_argument("--meshes", default="8x1x1,4x2x1,2x4x1,1x8x1",
                    help="comma list of DATAxFSDPxTENSOR")
    ap.add_argument("--check", action="store_true",
                    help="also build the state and compare each device's shards")
    ap.add_argument("--json", action="store_true", help="one JSON line a mesh")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE, as train.py's --config.KEY")
    args = ap.parse_args(argv)
    print(f"{jax.device_count()} {jax.devices()[0].platform} device(s)", file=sys.stderr)
    for text in args.meshes.split(","):
        mesh_keys = parse_mesh(text)
        config = config_tools.config_with_overrides(args.config, args.overrides)
        config_tools.set_values(config, mesh_keys)
        config_tools.check_config(config)
        model, layout, _ = describe(config)
        row = {"mesh": text, **state_bytes(model, layout)}
        split = mesh_keys["mesh.fsdp"] * mesh_keys["mesh.tensor"]
        row["per_device_over_even_split"] = row["per_device"] / (row["total"] / split)
        if args.check:
            row["placed_max"] = max(placed_bytes(model, layout).values())
        if args.json:
            print(json.dumps(row), flush=True)
            continue
        placed = f", built: {_mib(row['placed_max'])}" if args.check else ""
        print(f"{text:>8}: total {_mib(row['total'])}, per device {_mib(row['per_device'])} "
              f"({row['per_device_over_even_split']:.3f}x total / {split}), unsplit "
              f"{_mib(row['replicated'])}{placed}", flush=True)


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:,.2f} MiB"


if __name__ == "__main__":
    main()
