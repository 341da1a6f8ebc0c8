"""Forward + backward time of the delta rules' input path (stacked short conv, SiLU, q/k
L2 norm and scale) alone: XLA's form (models.layers.conv_silu_norm, conv_impl "xla")
against the Pallas kernel (kernels.pallas.short_conv) at several row blocks and warps,
in one process, to choose the kernel's tuning. A diagnostic: the figures of record are
train.py's own (scripts/train_speed.py with --config.model.conv_impl=pallas).

    python scripts/bench_short_conv.py [--shape 4x2048x1024x8] [--conv 4]
        [--settings 16x4,32x4,64x8,16x4:input] [--out FILE.json]

A setting is ROWSxWARPS, optionally :input for the backward's stored cotangent in x's
dtype rather than float32 (short_conv.conv_silu_norm's dpre_dtype).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from kernels.pallas import short_conv  # noqa: E402
from models import ModelConfig, layers  # noqa: E402
from scripts import bench_kernels  # noqa: E402

INPUTS = 3  # q, k, v
NORMALIZE = (True, True, False)


def setup(b: int, t: int, d_model: int, heads: int, conv: int, dtype):
    """(x (B, T, 3, C), weights (conv, 3, C) float32, segment ids with two documents a
    row, output cotangents, the convs holding the weights)."""
    head_dim = d_model // heads
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (b, t, INPUTS, d_model), jnp.float32).astype(dtype)
    w = jax.random.uniform(jax.random.fold_in(key, 1), (conv, INPUTS, d_model),
                           jnp.float32, -0.5, 0.5)
    segment_ids = (jnp.arange(t) >= t // 3).astype(jnp.int32)[None].repeat(b, 0)
    cts = [jax.random.normal(jax.random.fold_in(key, 2 + n), (b, t, d_model),
                             jnp.float32).astype(dtype) for n in range(INPUTS)]
    cfg = ModelConfig(conv_size=conv, d_model=d_model, num_heads=heads)
    convs = [layers.ShortConv(cfg, d_model, rngs=nnx.Rngs(0)) for _ in range(INPUTS)]
    for n, c in enumerate(convs):
        c.kernel[...] = w[:, n]
    scale = (1.0 / math.sqrt(head_dim), 1.0, 1.0)
    return x, w, segment_ids, cts, convs, head_dim, scale


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4x2048x1024x8", help="BxTxD_MODELxHEADS")
    p.add_argument("--conv", type=int, default=4)
    p.add_argument("--settings", default="16x4,32x4,64x8,16x4:input",
                   help="ROWSxWARPS[:input],...")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    b, t, d_model, heads = (int(v) for v in args.shape.split("x"))
    dtype = jnp.dtype(args.dtype)
    x, w, seg, cts, convs, head_dim, scale = setup(b, t, d_model, heads, args.conv, dtype)
    graph, state = nnx.split(convs)
    positions = jnp.broadcast_to(layers.segment_positions(seg, t), (b, t))

    def xla(x, state):
        outs, _ = layers.conv_silu_norm(nnx.merge(graph, state), x, segment_ids=seg,
                                        head_dim=head_dim, normalize=NORMALIZE,
                                        scale=scale, impl="chunk")
        return tuple(outs)

    def fused(rows, warps, dpre_dtype):
        return lambda x, w: short_conv.conv_silu_norm(x, w, positions, head_dim, NORMALIZE,
                                                      scale, 1e-6, rows, warps, dpre_dtype)

    def fwd_bwd(fn):
        def run(x, params):
            outs, pull = jax.vjp(fn, x, params)
            return outs, pull(tuple(cts))
        return jax.jit(run)

    rows = [("xla", fwd_bwd(xla), state)]
    for setting in args.settings.split(","):
        launch, _, dpre = setting.partition(":")
        r, nw = (int(v) for v in launch.split("x"))
        rows.append((f"pallas_{setting}", fwd_bwd(fused(r, nw, dpre or "float32")), w))
    results = {}
    want = None
    for name, fn, params in rows:
        outs, grads = fn(x, params)
        dx = grads[0].astype(jnp.float32)
        if want is None:
            want = dx
        err = float(jnp.max(jnp.abs(dx - want)) / jnp.max(jnp.abs(want)))
        ms = 1e3 * bench_kernels.time_jax(fn, x, params)
        results[name] = {"ms": ms, "dx_rel_err_vs_xla": err}
        print(f"{args.shape} conv{args.conv} {name:>14}: {ms:7.3f} ms fwd+bwd  "
              f"(dx max rel diff vs xla {err:.1e})", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            {"shape": args.shape, "conv": args.conv, "dtype": args.dtype,
             "device": str(jax.devices()[0]), "rows": results}, indent=1))


if __name__ == "__main__":
    main()
