"""The static plan of one recurrence call: its Config (a nondiff, hashable argument of the
custom VJP), the value block each GPU program carries, and the Triton settings of the
sequential kernels."""
from __future__ import annotations

from typing import NamedTuple

from kernels.pallas import common
from kernels.pallas.tuning import Tuning


class Config(NamedTuple):
    """Static description of one call (hashable: it is a nondiff argument)."""
    chunk: int
    variant: str          # "gpu" | "tpu"
    out_dtype: str        # dtype name of O
    block_v: int          # value columns per program (gpu); the whole V on tpu
    tuning: Tuning


class Dims(NamedTuple):
    """The sizes of one recurrence call: batch, padded time, heads, key and value dims,
    chunks; whether it has W (the delta rule) and G (a decay)."""
    b: int
    tp: int
    h: int
    kdim: int
    vdim: int
    n: int
    has_w: bool
    has_g: bool


def dims(w, ut, q, gam, chunk: int) -> Dims:
    b, tp, h, kdim = q.shape
    return Dims(b, tp, h, kdim, ut.shape[-1], tp // chunk, w is not None, gam is not None)


def block_v(kdim: int, vdim: int, variant: str, programs: int, tuning: Tuning) -> int:
    """Value columns per GPU program. The state slice (K x BV float32) stays in registers;
    the sequential loop runs one program per (batch*head, value block), so with few heads
    the value dim is split further to keep more of the chip's SMs busy."""
    if variant != "gpu":
        return vdim
    if tuning.block_v is not None:
        return min(tuning.block_v, vdim)
    bv = min(64 if kdim <= 128 else 32, vdim)
    while bv > tuning.min_block_v and programs * (vdim // bv) < tuning.seq_programs:
        bv //= 2
    return bv


def fitting_stages(kdim: int, tuning: Tuning) -> int:
    """Pipeline stages of the sequential kernels: each stage buffers the chunk's C x K q
    and k tiles, so past 128 keys at most 2 fit the H200's 232,448 bytes of shared
    memory."""
    return tuning.seq_stages if kdim <= 128 else min(tuning.seq_stages, 2)


def sequential_params(kdim: int, bv: int, tuning: Tuning):
    """Triton settings of a sequential (loop over chunks) GPU kernel."""
    warps = tuning.seq_warps or (4 if kdim * bv <= 8192 else 8)
    return common.compiler_params("gpu", num_warps=warps,
                                  num_stages=fitting_stages(kdim, tuning))
