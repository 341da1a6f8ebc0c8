"""The Triton programs the Pallas GPU kernels lower to, without source locations, for
checking that a change to kernels/pallas leaves them as they were. Runs on a CPU machine
(Pallas' Triton lowering needs no GPU).

    python scripts/lowered_programs.py dump BEFORE.json     # on the old code
    python scripts/lowered_programs.py dump AFTER.json      # on the new code
    python scripts/lowered_programs.py compare BEFORE.json AFTER.json

Each case (op, chunk size, shape; forward and gradient) lowers at the default Tuning; a
program is its launch settings (grid, warps, stages, name) and its Triton IR printed
without debug info. compare prints the programs that differ and exits 1 if any do.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

SHAPES = [(1, 128, 2, 64), (2, 200, 4, 128), (1, 64, 1, 256), (1, 96, 16, 32)]
LAUNCH_KEYS = ("grid_x", "grid_y", "grid_z", "num_warps", "num_stages", "name")


def ops():
    """{case name: fn(q, k, v, g, beta)} of every GPU program family."""
    import kernels.pallas as kp
    out = {}
    for c in (32, 64):
        out[f"gdn_c{c}"] = lambda q, k, v, g, b, c=c: kp.gated_delta_rule(
            q, k, v, g, b, chunk_size=c, variant="gpu")
        out[f"gdn_xlaprep_c{c}"] = lambda q, k, v, g, b, c=c: kp.gated_delta_rule(
            q, k, v, g, b, chunk_size=c, variant="gpu", fused_prep=False)
        out[f"lin_decay_norm_c{c}"] = lambda q, k, v, g, b, c=c: kp.linear_attention(
            q, k, v, normalize=True, log_decay=g, chunk_size=c, variant="gpu")
        out[f"lin_nodecay_c{c}"] = lambda q, k, v, g, b, c=c: kp.linear_attention(
            q, k, v, normalize=False, chunk_size=c, variant="gpu")
        out[f"lin_headdecay_c{c}"] = lambda q, k, v, g, b, c=c: kp.linear_attention(
            q, k, v, normalize=True, log_decay=g[0, 0], chunk_size=c, variant="gpu")
    return out


def _programs(op, out, ctx):
    """Append each Pallas Triton call under MLIR operation `op` to out, as text."""
    from jax._src.lib.mlir import ir
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if (inner.name == "stablehlo.custom_call"
                        and "mhlo.backend_config" in inner.attributes):
                    config = ir.DictAttr(inner.attributes["mhlo.backend_config"])
                    launch = {key: str(config[key]) for key in LAUNCH_KEYS if key in config}
                    module = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes, ctx)
                    out.append(json.dumps(launch, sort_keys=True) + "\n"
                               + module.operation.get_asm(enable_debug_info=False))
                _programs(inner, out, ctx)


def lowered(fn, shape):
    import jax
    import jax.numpy as jnp
    from jax._src.pallas.triton.lowering import _new_ir_context
    b, t, h, d = shape
    q = jax.random.normal(jax.random.PRNGKey(0), (b, t, h, d), jnp.bfloat16)
    g = jnp.full((b, t, h), -0.01, jnp.float32)
    beta = jnp.full((b, t, h), 0.5, jnp.float32)
    module = jax.jit(fn).trace(q, q, q, g, beta).lower(
        lowering_platforms=("cuda",)).compiler_ir("stablehlo")
    programs = []
    with _new_ir_context() as ctx:
        _programs(module.operation, programs, ctx)
    return programs


def dump(path):
    import jax
    import jax.numpy as jnp
    from kernels.pallas import common
    common.interpret = lambda: False      # the compiled path, lowered for "cuda"
    record = {}
    for shape in SHAPES:
        for name, fn in ops().items():
            grad = jax.grad(lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32)),
                            argnums=(0, 1, 2, 3))
            record[f"{name}/{shape}/fwd"] = lowered(fn, shape)
            record[f"{name}/{shape}/grad"] = lowered(grad, shape)
    pathlib.Path(path).write_text(json.dumps(record))
    print(f"{len(record)} cases, {sum(map(len, record.values()))} programs -> {path}")


def compare(before_path, after_path) -> int:
    before = json.loads(pathlib.Path(before_path).read_text())
    after = json.loads(pathlib.Path(after_path).read_text())
    differing = 0
    for case in sorted(set(before) | set(after)):
        old, new = before.get(case, []), after.get(case, [])
        if len(old) != len(new):
            print(f"{case}: {len(old)} programs before, {len(new)} after")
            differing += 1
            continue
        for a, b in zip(old, new):
            if a != b:
                differing += 1
                print(f"{case}: {a.splitlines()[0]} -> {b.splitlines()[0]}")
    total = sum(map(len, before.values()))
    print(f"{differing} of {total} programs differ")
    return 1 if differing else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("dump").add_argument("out")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args(argv)
    if args.command == "dump":
        dump(args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
