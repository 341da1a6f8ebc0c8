"""GPU check of kernels.attention's packed-sequence path (max_segments > 0): causal
softmax attention over packed documents handed to cuDNN as one sequence per document,
against the same call with the segment mask (the default path) and, at a small size,
the float32 XLA form. Prints the largest differences of outputs and gradients, whether
the packed program was the one compiled, and each path's forward + backward time.

    python docs/measurements/session36/packed_check.py [--cpu]   (PYTHONPATH: the repository)

Documents are the rows of configs/lm_files.py with data.sample_by=paragraph on
tiny-Shakespeare when .jobs/input.txt exists (53 per row at T 8,192: 5.3% of the causal
T x T lies within documents), else runs of random length (mean 155 tokens).
"""
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from kernels import attention  # noqa: E402
from scripts.bench_kernels import time_jax  # noqa: E402

TEXT = pathlib.Path(".jobs/input.txt")


def segments(b, t, seed=0):
    if TEXT.exists():
        import data
        from training import config_tools
        c = config_tools.load_config_file("configs/lm_files.py")
        c.unlock()
        c.data.update(dict(files=str(TEXT), sample_by="paragraph", seq_len=t))
        return jnp.asarray(data.build(c.data, seed=seed).batch(0, b)["segment_ids"])
    rng = np.random.default_rng(seed)
    lens = rng.geometric(1 / 155, size=(b, t))
    return jnp.asarray(np.stack([np.repeat(np.arange(t), l)[:t] for l in lens]), jnp.int32)


def loss_fn(max_segments, impl="auto"):
    @jax.jit
    def loss(q, k, v, seg):
        o = attention.softmax_attention(q, k, v, segment_ids=seg, causal=True, impl=impl,
                                        max_segments=max_segments)
        return jnp.sum(o.astype(jnp.float32) * w[: o.shape[1]]), o
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


print(jax.devices()[0].device_kind, "jax", jax.__version__)
SHAPES = ((2, 1024, 4, 64, 32), (4, 2048, 8, 128, 64), (4, 8192, 8, 128, 128))
if "--cpu" in sys.argv:  # the script's mechanics on a CPU (both paths are XLA's there)
    SHAPES = ((1, 256, 2, 16, 8),)
for b, t, h, d, m in SHAPES:
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.bfloat16) for _ in range(3))
    w = jnp.asarray(rng.normal(size=(t, h, d)), jnp.float32)  # a fixed cotangent
    seg = segments(b, t)
    runs = int(jnp.max(attention.packed_layout(seg, m)[2]))
    packed, masked = loss_fn(m), loss_fn(0)
    jaxpr = str(jax.make_jaxpr(packed)(q, k, v, seg))  # the packed call sits under a cond
    (_, o_p), g_p = packed(q, k, v, seg)
    (_, o_m), g_m = masked(q, k, v, seg)
    line = (f"B{b} T{t} H{h} D{d}: runs per row <= {runs} (max_segments {m}); packed "
            f"path traced: {'cond[' in jaxpr}; packed vs mask: "
            f"out {max_diff(o_p, o_m):.3g}, grads {max_diff(g_p, g_m):.3g}")
    if t <= 1024:
        (_, o_x), g_x = loss_fn(0, "xla")(q.astype(jnp.float32), k.astype(jnp.float32),
                                          v.astype(jnp.float32), seg)
        line += f"; packed vs XLA f32: out {max_diff(o_p, o_x):.3g}, grads {max_diff(g_p, g_x):.3g}"
    print(line)
    tp, tm = time_jax(packed, q, k, v, seg), time_jax(masked, q, k, v, seg)
    print(f"  fwd+bwd: packed {tp * 1e3:.3f} ms, mask {tm * 1e3:.3f} ms ({tm / tp:.2f}x)")
    # one row past max_segments: the mask path under the same program, same values
    many = jnp.asarray(np.broadcast_to(np.arange(t) // max(1, t // (2 * m)), (b, t)))
    (_, o_1), _ = packed(q, k, v, many)
    (_, o_2), _ = masked(q, k, v, many)
    print(f"  rows of {2 * m} runs (> max_segments): packed-program vs mask out "
          f"{max_diff(o_1, o_2):.3g}")
