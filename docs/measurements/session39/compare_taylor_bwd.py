"""Based's Taylor-feature gradient on the GPU, two forms in one process (issue 16; a
one-off comparison for the next GPU call, to be removed once it has run):

- "autodiff": autodiff of the pair slices (models.feature_maps._taylor_symmetric_forward),
  the default off CPU. At B4 T8192 d1024 its cotangent reductions are two
  `input_pad_reduce_fusion`s, 0.72 + 0.47 ms of a 7.9 ms Based mixer (session 39, H100).
- "written": the written-out backward (U + U^T) x (feature_maps._taylor_symmetric), the
  CPU's default; session 32 found it a tie on the GPU at tiny-Shakespeare's T 256, d 384.

    python docs/measurements/session39/compare_taylor_bwd.py [--shapes 4x8192x1024x8,...]

Prints, per shape, the softmax mixer and the Based mixer with each form, fwd + bwd
(scripts/mixer_speed.py's step, one document a row, bf16), timed round-robin for
--rounds rounds (median ms of each), and the two forms' largest gradient difference
relative to the largest gradient (bf16 rounding is ~4e-3).
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models import feature_maps as fm  # noqa: E402
from scripts import bench_kernels  # noqa: E402
from scripts.mixer_speed import mixer_fwd_bwd  # noqa: E402

FORMS = {"autodiff": fm._taylor_symmetric_forward, "written": fm._taylor_symmetric}


@contextlib.contextmanager
def taylor_form(form: str):
    """feature_maps.taylor_symmetric as `form` while a program is traced."""
    default = fm.taylor_symmetric
    fm.taylor_symmetric = FORMS[form]
    try:
        yield
    finally:
        fm.taylor_symmetric = default


def compiled(name, shape, dtype, form=None):
    b, t, d_model, heads = shape
    fn, args = mixer_fwd_bwd(name, b, t, d_model, heads, dtype, {}, docs=1)
    with taylor_form(form) if form else contextlib.nullcontext():
        return fn.lower(*args).compile(), args


def largest_difference(a, b) -> float:
    """max |a - b| / max |a| over every leaf of two gradient trees."""
    diffs = jax.tree.leaves(jax.tree.map(
        lambda x, y: jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))), a, b))
    sizes = jax.tree.leaves(jax.tree.map(lambda x: jnp.max(jnp.abs(x.astype(jnp.float32))), a))
    return float(max(diffs) / max(sizes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x8192x1024x8,4x2048x1024x8,64x256x384x6")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for text in a.shapes.split(","):
        shape = tuple(map(int, text.split("x")))
        programs = {"softmax": compiled("softmax", shape, a.dtype),
                    **{f"based {form}": compiled("based", shape, a.dtype, form)
                       for form in FORMS}}
        outs = {k: jax.block_until_ready(f(*args)) for k, (f, args) in programs.items()}
        diff = largest_difference(outs["based autodiff"][1], outs["based written"][1])
        times = {k: [] for k in programs}
        for _ in range(a.rounds):
            for k, (f, args) in programs.items():
                times[k].append(bench_kernels.time_jax(f, *args) * 1e3)
        soft = statistics.median(times["softmax"])
        for k, ms in times.items():
            med = statistics.median(ms)
            print(f"{text} {k:16s} {med:8.3f} ms ({soft and med / soft:.3f}x softmax; "
                  f"rounds {', '.join(f'{m:.3f}' for m in ms)})", flush=True)
        print(f"{text} gradients, written vs autodiff: max |diff| / max |grad| = "
              f"{diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
