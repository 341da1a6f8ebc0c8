"""Issue 15, session 10 call 1: the packed-row GDN kernels with the sequential walk split
into pieces at document starts (Tuning.piece_chunks; 0 = the unsplit walk of session 9),
against fla's varlen forward (`chunk_gated_delta_rule(cu_seqlens=...)`, every document
its own sequence), anchor first in each row, one process, nothing else on the GPU.
Rows: log-normal documents (mean 512) packed into B x T = 1x32768, 2x8192, 4x8192.
Then the split and unsplit kernels compared (outputs and gradients, bf16) at 1x32768.

    OUT=dir python3 docs/measurements/session10/packed_pieces.py
"""
import dataclasses
import json
import os
import pathlib
import sys

sys.path.insert(0, "scripts")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_kernels as bk  # noqa: E402
import kernels.pallas as kp  # noqa: E402

OUT = pathlib.Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
PIECES = {(1, 32768): (0, 4, 8, 16, 32), (2, 8192): (0, 8, 16), (4, 8192): (0, 8, 16)}
results = {}


def tuning(pc):
    return dataclasses.replace(kp.DEFAULT_TUNING, piece_chunks=pc)


def fla_varlen_fwd_bwd(torch, fops, rows):
    total = sum(map(sum, rows))
    q, k, v, g, beta = bk.fla_gdn_inputs(torch, 1, total, bk.H, bk.D)
    for x in (q, k, v, g, beta):
        x.requires_grad_(True)
    starts = np.concatenate([[0], np.cumsum([n for r in rows for n in r])])
    cu = torch.tensor(starts, dtype=torch.long, device="cuda")
    do = torch.randn_like(v)

    def step():
        o, _ = fops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
        o.backward(do)
    return bk.time_torch(step)


torch, fops = bk.fla_module()
for (b, t), settings in PIECES.items():
    rows = bk.packed_lengths(b * t, b, t)
    seg = bk.segment_ids_of(rows)
    line = {"docs": sum(map(len, rows)),
            "fla_varlen_fwd_ms": bk.fla_varlen(torch, fops, rows, bk.H, bk.D) * 1e3,
            }
    try:    # fla 0.6.0 refuses its gated backward on Hopper with triton < 3.7.1
        line["fla_varlen_fwd_bwd_ms"] = fla_varlen_fwd_bwd(torch, fops, rows) * 1e3
    except RuntimeError as e:
        line["fla_varlen_fwd_bwd_ms"] = f"failed: {str(e)[:80]}"
    q, k, v, g, beta = bk.gdn_inputs(jax.random.PRNGKey(b * t + 1), b, t)
    do = jax.random.normal(jax.random.PRNGKey(7), v.shape, v.dtype)
    for pc in settings:
        f = bk.gdn_fn("pallas", tuning=tuning(pc), segment_ids=seg)
        line[f"fwd_pc{pc}_ms"] = bk.time_jax(jax.jit(f), q, k, v, g, beta) * 1e3
        if pc in (0, 16):
            line[f"fwd_bwd_pc{pc}_ms"] = bk.time_jax(bk.fwd_bwd(f, 5), q, k, v, g, beta,
                                                     do) * 1e3
    best = min(settings, key=lambda pc: line[f"fwd_pc{pc}_ms"])
    line["best_fwd_pieces"] = best
    line["ratio_default_to_fla"] = line["fwd_pc16_ms"] / line["fla_varlen_fwd_ms"]
    results[f"{b}x{t}"] = line
    (OUT / "packed_pieces.json").write_text(json.dumps(results, indent=1))
    print(f"{b}x{t}", {k: round(v, 4) if isinstance(v, float) else v
                       for k, v in line.items()}, flush=True)

# split vs unsplit on the GPU: forward and gradients, bf16 inputs
b, t = 1, 32768
rows = bk.packed_lengths(b * t, b, t)
seg = bk.segment_ids_of(rows)
q, k, v, g, beta = bk.gdn_inputs(jax.random.PRNGKey(3), b, t)


def run(pc):
    f = bk.gdn_fn("pallas", tuning=tuning(pc), segment_ids=seg)
    out = jax.jit(f)(q, k, v, g, beta)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2),
                             argnums=(0, 1, 2, 3, 4)))(q, k, v, g, beta)
    return [out, *grads]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


split, whole = run(16), run(0)
check = {name: rel(a, b) for name, a, b in zip(["o", "dq", "dk", "dv", "dg", "dbeta"],
                                                split, whole)}
check["finite"] = bool(all(np.isfinite(np.asarray(x, np.float32)).all() for x in split))
results["split_vs_unsplit_1x32768"] = check
(OUT / "packed_pieces.json").write_text(json.dumps(results, indent=1))
print("split vs unsplit (relative error)", check, flush=True)
