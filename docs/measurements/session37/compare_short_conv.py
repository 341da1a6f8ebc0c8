"""The short conv's backward, session 36's programs against today's, side by side in one
process: forward + backward of kernels.pallas.short_conv.conv_silu_norm alone (q, k, v
of a gated DeltaNet layer, 16-row blocks x 4 warps, two documents a row, bf16), with the
stored cotangent in float32 and in x's dtype, three rounds round-robin; and today's
gradients against session 36's (same stored dtype: the same arithmetic, regrouped).

    python docs/measurements/session37/compare_short_conv.py [--shapes 4x8192x1024x8,...]
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(pathlib.Path(__file__).resolve().parent)]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import short_conv_s36  # noqa: E402
from kernels.pallas import short_conv  # noqa: E402
from models import layers  # noqa: E402
from scripts import bench_kernels  # noqa: E402

NORMALIZE = (True, True, False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x8192x1024x8,4x2048x1024x8,64x256x384x6")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for shape in a.shapes.split(","):
        b, t, d_model, heads = (int(v) for v in shape.split("x"))
        head_dim = d_model // heads
        key = jax.random.PRNGKey(0)
        x = jax.random.normal(key, (b, t, 3, d_model), jnp.float32).astype(jnp.bfloat16)
        w = jax.random.uniform(jax.random.fold_in(key, 1), (4, 3, d_model), jnp.float32,
                               -0.5, 0.5)
        seg = (jnp.arange(t) >= t // 2).astype(jnp.int32)[None].repeat(b, 0)
        pos = jnp.broadcast_to(layers.segment_positions(seg, t), (b, t))
        cts = tuple(jax.random.normal(jax.random.fold_in(key, 2 + n), (b, t, d_model),
                                      jnp.float32).astype(jnp.bfloat16) for n in range(3))
        scale = (1.0 / math.sqrt(head_dim), 1.0, 1.0)

        def fwd_bwd(module, dpre):
            def run(x, w):
                outs, pull = jax.vjp(lambda x, w: module.conv_silu_norm(
                    x, w, pos, head_dim, NORMALIZE, scale, 1e-6, 16, 4, dpre), x, w)
                return outs, pull(cts)
            return jax.jit(run)

        variants = {f"{name}_{dpre}": fwd_bwd(module, dpre)
                    for name, module in (("s36", short_conv_s36), ("today", short_conv))
                    for dpre in ("float32", "input")}
        for dpre in ("float32", "input"):
            (_, (dx0, dw0)), (_, (dx1, dw1)) = (variants[f"{n}_{dpre}"](x, w)
                                                for n in ("s36", "today"))
            rel = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(  # noqa: E731
                jnp.float32))) / jnp.max(jnp.abs(b.astype(jnp.float32))))
            print(f"{shape} dpre {dpre}: today vs s36 dx {rel(dx1, dx0):.1e}, "
                  f"dw {rel(dw1, dw0):.1e}", flush=True)
        times = {name: [] for name in variants}
        for _ in range(a.rounds):
            for name, fn in variants.items():
                times[name].append(1e3 * bench_kernels.time_jax(fn, x, w))
        base = statistics.median(times["s36_float32"])
        for name, ms in times.items():
            med = statistics.median(ms)
            print(f"{shape} {name:14s} {med:7.3f} ms fwd+bwd ({base / med:.2f}x s36_float32;"
                  f" rounds {', '.join(f'{v:.3f}' for v in ms)})", flush=True)


if __name__ == "__main__":
    main()
