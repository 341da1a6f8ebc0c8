"""Session 41, issue 16: Based's 153 Taylor features through the Pallas linear attention as
one 256-wide tile (Tuning(feature_tiles=1), the form before) against two tiles of 128 + 32
(the default now), forward + backward in bfloat16, then the Based mixer alone beside the
softmax mixer (scripts/mixer_speed.py's step). Rounds interleave the forms in one process;
medians of scripts.bench_kernels.time_jax. Also checks that both tilings give the same
outputs and gradients (to bf16 rounding).

    python docs/measurements/session41/compare_feature_tiles.py [--rounds 3]

Runs at commit 767958b only: two tiles measured 1.26x slower than one (README beside this
file), so the split and Tuning.feature_tiles were removed after call 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kernels import ops  # noqa: E402
from kernels.pallas import DEFAULT_TUNING  # noqa: E402
from models import feature_maps as fm  # noqa: E402
from scripts import bench_kernels, mixer_speed  # noqa: E402


def op_fwd_bwd(b, t, h, d, dv, tiles):
    tuning = dataclasses.replace(DEFAULT_TUNING, feature_tiles=tiles)
    key = jax.random.PRNGKey(t)
    ks = jax.random.split(key, 4)
    xq, xk = (jax.random.normal(k, (b, t, h, d), jnp.float32).astype(jnp.bfloat16)
              * d ** -0.25 for k in ks[:2])
    v = jax.random.normal(ks[2], (b, t, h, dv), jnp.float32).astype(jnp.bfloat16)
    do = jax.random.normal(ks[3], (b, t, h, dv), jnp.float32).astype(jnp.bfloat16)

    def step(xq, xk, v, do):
        def apply(xq, xk, v):
            phi_q, phi_k = fm.taylor_symmetric(xq), fm.taylor_symmetric(xk)
            return ops.linear_attention(phi_q, phi_k, v, impl="pallas", chunk_size=64,
                                        pallas_tuning=tuning, taylor_qk=(xq, xk))
        o, pull = jax.vjp(apply, xq, xk, v)
        return o, pull(do)
    return jax.jit(step), (xq, xk, v, do)


def max_rel(a, b):
    a, b = (jnp.asarray(x, jnp.float32) for x in (a, b))
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="")
    a = p.parse_args()
    print(jax.devices()[0].device_kind, flush=True)
    rows = []
    for b, t in ((4, 8192), (4, 2048), (64, 256)):
        h, dv = (8, 128) if t > 256 else (6, 64)
        fns = {tiles: op_fwd_bwd(b, t, h, 16, dv, tiles) for tiles in (1, 2)}
        outs = {tiles: fn(*args) for tiles, (fn, args) in fns.items()}
        flat = [jax.tree_util.tree_leaves(outs[tiles]) for tiles in (1, 2)]
        diff = max(max_rel(x2, x1) for x1, x2 in zip(*flat))
        times = {1: [], 2: []}
        for _ in range(a.rounds):
            for tiles, (fn, args) in fns.items():
                times[tiles].append(bench_kernels.time_jax(fn, *args) * 1e3)
        one, two = (statistics.median(times[k]) for k in (1, 2))
        print(f"op B{b} T{t} H{h} F153 Dv{dv}: one tile {one:.3f} ms, two tiles {two:.3f} ms "
              f"({two / one:.3f}x); rounds {times}; max |diff| / max {diff:.2e}", flush=True)
        rows.append({"what": "op", "b": b, "t": t, "one_tile_ms": times[1],
                     "two_tiles_ms": times[2], "max_rel_diff": diff})
    for shape in ("4x8192x1024x8", "4x2048x1024x8", "64x256x384x6"):
        b, t, d_model, heads = map(int, shape.split("x"))
        fns = {name: mixer_speed.mixer_fwd_bwd(name, b, t, d_model, heads, "bfloat16", {},
                                               docs=1) for name in ("softmax", "based")}
        times = {name: [] for name in fns}
        for _ in range(a.rounds):
            for name, (fn, args) in fns.items():
                times[name].append(bench_kernels.time_jax(fn, *args) * 1e3)
        soft, based = (statistics.median(times[k]) for k in ("softmax", "based"))
        print(f"mixer {shape}: softmax {soft:.3f} ms, based {based:.3f} ms "
              f"({based / soft:.3f}x softmax); rounds {times}", flush=True)
        rows.append({"what": "mixer", "shape": shape, **{f"{k}_ms": v for k, v in times.items()}})
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
