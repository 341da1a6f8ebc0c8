"""Forward + backward time of each mixer module alone (projections, convs, norms, gates and
the op), as issue 16's first table measures it, and optionally where that time goes.

    python scripts/mixer_speed.py [--mixers softmax,gated_deltanet,linear,based]
        [--shapes 4x8192x1024x8,64x256x384x6] [--dtype bfloat16] [--profile gated_deltanet]
        [--set window_impl=cudnn,...] [--docs 2] [--hlo DIR] [--out FILE.json]

Each mixer is built from models.ModelConfig at (d_model, heads) with the run's compute
dtype and float32 parameters (the configs' default), called on x (B, T, d_model) holding
--docs documents a row (> 1: with segment ids, as train.py's loss passes them for packed
rows; 1: none, as for rows cut from documents longer than the context), and
differentiated with respect to its parameters and x against a fixed cotangent: the
mixer's share of a train step. Times are
the median of scripts.bench_kernels.time_jax (compilation excluded). --profile names the
mixers whose device kernels are listed (jax.profiler, top 25 by time). A diagnostic: the
figures of record are train.py's own (scripts/train_speed.py).
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from models import ModelConfig  # noqa: E402
from models.mixers import get_mixer  # noqa: E402
from scripts import bench_kernels, profile_kernels  # noqa: E402


def mixer_fwd_bwd(name: str, b: int, t: int, d_model: int, heads: int, dtype: str,
                  overrides: dict, docs: int = 2):
    """(jitted fwd+bwd function, its arguments) of mixer `name` at (b, t, d_model)."""
    cfg = ModelConfig(d_model=d_model, num_heads=heads, mixer=name, dtype=dtype,
                      max_len=t, **overrides)
    mixer = get_mixer(name)(cfg, rngs=nnx.Rngs(0))
    graph, params = nnx.split(mixer)
    key = jax.random.PRNGKey(t)
    x = jax.random.normal(key, (b, t, d_model), jnp.float32).astype(dtype)
    dy = jax.random.normal(jax.random.fold_in(key, 1), x.shape, jnp.float32).astype(dtype)
    # `docs` documents a row of equal length (the first starts at 0); one: no segment ids
    segment_ids = None
    if docs > 1:
        segment_ids = (jnp.arange(t) * docs // t).astype(jnp.int32)[None].repeat(b, 0)

    def step(params, x, dy, segment_ids):
        def apply(params, x):
            return nnx.merge(graph, params)(x, segment_ids=segment_ids)
        y, pull = jax.vjp(apply, params, x)
        return y, pull(dy)
    return jax.jit(step), (params, x, dy, segment_ids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mixers", default="softmax,gated_deltanet,linear,based")
    p.add_argument("--shapes", default="4x8192x1024x8,64x256x384x6",
                   help="comma list of BxTxD_MODELxHEADS")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--set", default="", help="ModelConfig fields, k=v,... (ints/bools)")
    p.add_argument("--profile", default="", help="mixers to list kernel by kernel")
    p.add_argument("--hlo", default="", help="folder for the profiled mixers' optimised "
                   "HLO (gzipped), to find a kernel's fusion by name")
    p.add_argument("--barrier_l2", action="store_true",
                   help="experiment: the delta rules' q, k l2 norm behind an optimization "
                   "barrier (kept out of the short conv's fusion)")
    p.add_argument("--docs", type=int, default=2,
                   help="documents a row (1: no segment ids, softmax is causal only)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.docs < 1:
        p.error(f"--docs must be >= 1, got {a.docs}")
    overrides = {}
    for item in filter(None, a.set.split(",")):
        key, value = item.split("=")
        overrides[key] = {"True": True, "False": False}.get(value, value)
        if isinstance(overrides[key], str) and value.lstrip("-").isdigit():
            overrides[key] = int(value)
    if a.barrier_l2:
        from models.mixers import delta
        plain = delta.l2_normalize
        delta.l2_normalize = lambda x, *rest: plain(jax.lax.optimization_barrier(x), *rest)
    rows = []
    for shape in a.shapes.split(","):
        b, t, d_model, heads = map(int, shape.split("x"))
        base = None
        for name in a.mixers.split(","):
            try:
                fn, args = mixer_fwd_bwd(name, b, t, d_model, heads, a.dtype, overrides,
                                          a.docs)
                ms = bench_kernels.time_jax(fn, *args) * 1e3
            except Exception as e:  # noqa: BLE001 (one failing mixer keeps the others)
                print(f"{shape} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows.append({"shape": shape, "mixer": name, "error": str(e)[:300]})
                continue
            base = ms if name == "softmax" else base
            ratio = f"  {ms / base:.2f}x softmax" if base else ""
            print(f"{shape} {name:15s} {ms:8.3f} ms fwd+bwd{ratio}", flush=True)
            row = {"shape": shape, "mixer": name, "ms": ms, "overrides": overrides}
            if name in a.profile.split(","):
                per, _ = profile_kernels.profile(fn, args)
                total = sum(per.values())
                print(f"  kernels: {total:.3f} ms in {len(per)} kernels")
                for kname, kms in list(per.items())[:25]:
                    print(f"  {kms:8.3f} ms {100 * kms / max(total, 1e-9):5.1f}%  "
                          f"{kname[:110]}")
                row["kernels_ms"] = dict(list(per.items())[:60])
                if a.hlo:
                    text = fn.lower(*args).compile().as_text()
                    path = pathlib.Path(a.hlo) / f"{name}_{shape}.hlo.gz"
                    path.write_bytes(gzip.compress(text.encode()))
            rows.append(row)
            if a.out:
                pathlib.Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
