"""Sliding-window softmax on cuDNN (kernels.attention.sliding_window_attention impl
"cudnn": cuDNN's flash kernel with its local window) against the banded XLA form
("blocked"), bf16, B4 T8192 H8 D128 (Based's layers use window 64), with and without
packed documents: largest difference from a float32 banded reference, and fwd+bwd ms.

    OUT=dir python3 docs/measurements/session10/window_cudnn.py
"""
import json
import os
import pathlib
import sys

sys.path.insert(0, "scripts")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bench_kernels as bk  # noqa: E402
from kernels import attention  # noqa: E402

OUT = pathlib.Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
b, t, h, d, window = 4, 8192, 8, 128, 64
keys = jax.random.split(jax.random.PRNGKey(0), 4)
q, k, v = (jax.random.normal(kk, (b, t, h, d), jnp.bfloat16) for kk in keys[:3])
do = jax.random.normal(keys[3], (b, t, h, d), jnp.bfloat16)
seg = bk.segment_ids_of(bk.packed_lengths(5, b, t))
res = {}
for name, segment_ids in (("one document", None), ("packed", seg)):
    def fn(impl, dtype=jnp.bfloat16):
        def f(q, k, v):
            return attention.sliding_window_attention(
                q.astype(dtype), k.astype(dtype), v.astype(dtype), window=window,
                segment_ids=segment_ids, impl=impl)
        return f
    ref = jax.jit(fn("blocked", jnp.float32))(q, k, v).astype(jnp.float32)
    row = {}
    for impl in ("cudnn", "blocked"):
        try:
            out = jax.jit(fn(impl))(q, k, v).astype(jnp.float32)
            row[f"{impl}_max_err"] = float(jnp.max(jnp.abs(out - ref)))
            row[f"{impl}_fwd_bwd_ms"] = bk.time_jax(bk.fwd_bwd(fn(impl), 3), q, k, v,
                                                    do) * 1e3
        except Exception as e:  # noqa: BLE001
            row[f"{impl}_failed"] = f"{type(e).__name__}: {str(e)[:200]}"
    res[name] = row
    print(name, row, flush=True)
(OUT / "window_cudnn.json").write_text(json.dumps(res, indent=1))
