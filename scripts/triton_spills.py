"""Registers and spills of a Pallas GPU program, on a machine without a GPU.

    python scripts/triton_spills.py [--kernel short_conv|gdn] [--block_t 16] [--warps 4]
        [--tuning prep_bwd_warps=8,...]

Lowers the kernel's forward and gradient for CUDA (jax's Triton lowering runs on any
machine), keeps each program's Triton IR, compiles it with the `triton` package for
sm_90 (an H200) and runs its bundled ptxas -v, which reports the registers a thread
uses and the bytes it spills to local memory. A spilling program reads and writes those
bytes for every element it touches: session 15's kernels.pallas.short_conv backward
spilled 44 KB a thread and took 7.5 ms where XLA took ~0.3 ms (docs/benchmarks.md).
Needs `pip install triton` (the GPU image has it); a static check before spending device
time, not a timing.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kernels import ops  # noqa: E402


def captured_programs(loss, *args):
    """{name: (Triton IR text, warps, stages)} of every Pallas GPU program in
    jax.grad(loss)."""
    from jax._src.pallas.triton import pallas_call_registration as registration

    from kernels.pallas import common
    captured = []
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        captured.append(result.module.operation.get_asm(enable_debug_info=False))
        return result
    saved = (common.interpret, registration.lowering.lower_jaxpr_to_triton_module)
    common.interpret = lambda: False
    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        grad = jax.grad(loss, tuple(range(len(args))))
        text = jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        common.interpret, registration.lowering.lower_jaxpr_to_triton_module = saved
    programs = {}
    for ir in captured:
        name = ir.split("@", 2)[1].split()[0]
        found = re.search(rf'name = "{name}".*?num_stages = (\d+).*?num_warps = (\d+)',
                          text, re.S)
        programs[name] = (ir, int(found.group(2)) if found else 4,
                          int(found.group(1)) if found else 1)
    return programs


def short_conv_programs(block_t: int, warps: int, b=4, t=2048, heads=8, head_dim=128):
    """short_conv's forward and backward at B4 T2048 d1024 (the issue's row), bf16."""
    from kernels.pallas import short_conv
    c = heads * head_dim
    pos = jnp.zeros((b, t), jnp.int32)

    def loss(x, w):
        outs = short_conv.conv_silu_norm(x, w, pos, head_dim, (True, True, False),
                                         (head_dim ** -0.5, 1.0, 1.0), 1e-6, block_t, warps)
        return sum(jnp.sum(o.astype(jnp.float32)) for o in outs)
    programs = captured_programs(loss, jnp.zeros((b, t, 3, c), jnp.bfloat16),
                                 jnp.zeros((4, 3, c), jnp.float32))
    return {name: (ir, warps, 1) for name, (ir, _, _) in programs.items()}


def gdn_programs(tuning_spec: str = "", b=4, t=2048, heads=8, head_dim=128):
    """The gated delta rule's Pallas programs (forward and gradient, packed documents) at
    B4 T2048 H8 D128, bf16, at the default Tuning with tuning_spec's fields replaced
    (scripts.bench_kernels.parse_tuning: "key=value,...")."""
    import kernels.pallas as kp
    from scripts.bench_kernels import parse_tuning
    tuning = parse_tuning(tuning_spec)
    g = jnp.full((b, t, heads), -0.01, jnp.float32)
    beta = jnp.full((b, t, heads), 0.5, jnp.float32)
    seg = (jnp.arange(t) >= t // 3).astype(jnp.int32)[None].repeat(b, 0)

    def loss(q, k, v):
        o = kp.gated_delta_rule(q, k, v, g, beta, segment_ids=seg, variant="gpu",
                                tuning=tuning)
        return jnp.sum(o.astype(jnp.float32))
    x = jnp.zeros((b, t, heads, head_dim), jnp.bfloat16)
    return captured_programs(loss, x, x, x)


def ptxas_report(ttir: str, warps: int, stages: int = 1) -> str:
    """ptxas -v's register and spill lines for Triton IR text compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    folder = pathlib.Path(tempfile.mkdtemp())
    (folder / "k.ttir").write_text(ttir)
    compiled = triton.compile(str(folder / "k.ttir"), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    (folder / "k.ptx").write_text(compiled.asm["ptx"])
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    out = subprocess.run([ptxas, "-v", "-arch=sm_90a", str(folder / "k.ptx"), "-o",
                          str(folder / "k.cubin")], capture_output=True, text=True)
    return "; ".join(line.split(":", 1)[-1].strip()
                     for line in (out.stdout + out.stderr).splitlines()
                     if "registers" in line or "spill" in line)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="short_conv", choices=["short_conv", "gdn"])
    # short_conv: the setting kernels.ops runs unless told otherwise
    ap.add_argument("--block_t", type=int, default=ops._CONV_BLOCK_T)
    ap.add_argument("--warps", type=int, default=ops._CONV_WARPS)
    ap.add_argument("--tuning", default="", help="gdn: kernels.pallas.Tuning fields, "
                    "key=value,... (scripts/bench_kernels.py's parse_tuning)")
    args = ap.parse_args(argv)
    programs = (short_conv_programs(args.block_t, args.warps) if args.kernel == "short_conv"
                else gdn_programs(args.tuning))
    for name, (ttir, warps, stages) in programs.items():
        print(f"{name} ({warps} warps, {stages} stages): "
              f"{ptxas_report(ttir, warps, stages)}", flush=True)


if __name__ == "__main__":
    main()
