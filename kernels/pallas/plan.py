"""The static plan of one recurrence call: its Config (a nondiff, hashable argument of the
custom VJP), the value block each GPU program carries, and the Triton settings of the
sequential kernels."""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from kernels.pallas import common, documents
from kernels.pallas.tuning import Tuning


class Config(NamedTuple):
    """Static description of one call (hashable: it is a nondiff argument)."""
    chunk: int
    variant: str          # "gpu" | "tpu"
    out_dtype: str        # dtype name of O
    block_v: int          # value columns per program (gpu); the whole V on tpu
    tuning: Tuning
    pieces: int = 1       # pieces each row's sequential walk is split into (gpu, packed)


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


def pieces(num_chunks: int, variant: str, packed: bool, rows: int, kdim: int, vdim: int,
           tuning: Tuning) -> int:
    """Pieces each row's sequential GPU kernels split into: with packed documents and a
    grid that full-width value blocks leave short of tuning.seq_programs programs (rows =
    batch * heads), one piece per tuning.piece_chunks chunks (each piece restarts at a
    document start, so its walk is exact from a zero state:
    kernels.pallas.documents.piece_bounds); else 1. Each piece walks one chunk more than
    it writes, so on a grid that is already full the split only adds work."""
    if variant != "gpu" or not packed or tuning.piece_chunks == 0:
        return 1
    if rows * (vdim // _widest_block(kdim, vdim)) >= tuning.seq_programs:
        return 1
    return -(-num_chunks // tuning.piece_chunks)


def _widest_block(kdim: int, vdim: int) -> int:
    """The value columns a sequential program carries at most: its K x BV float32 state
    slice lives in registers."""
    return min(64 if kdim <= 128 else 32, vdim)


def block_v(kdim: int, vdim: int, variant: str, programs: int, tuning: Tuning) -> int:
    """Value columns per GPU program. The state slice (K x BV float32) stays in registers;
    the sequential loop runs one program per (batch*head, value block), so with few heads
    the value dim is split further to keep more of the chip's SMs busy."""
    if variant != "gpu":
        return vdim
    if tuning.block_v is not None:
        return min(tuning.block_v, vdim)
    bv = _widest_block(kdim, vdim)
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


def configure(chunk: int, variant: str, out_dtype, kdim: int, vdim: int, b: int, h: int,
              num_chunks: int, docs, tuning: Tuning):
    """(Config, piece bounds or None) of one recurrence call; docs: None or the packed
    documents' (runs, prev_run) of documents.chunk_runs."""
    count = pieces(num_chunks, variant, docs is not None, b * h, kdim, vdim, tuning)
    cfg = Config(chunk=chunk, variant=variant, out_dtype=jnp.dtype(out_dtype).name,
                 block_v=block_v(kdim, vdim, variant, b * h * count, tuning),
                 tuning=tuning, pieces=count)
    bounds = (None if count == 1
              else documents.piece_bounds(docs[0], chunk, count, tuning.piece_chunks))
    return cfg, bounds
