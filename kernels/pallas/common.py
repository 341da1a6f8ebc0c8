"""Shared helpers for the Pallas kernels: which lowering to use, padding, chunk layout.

Two kernel variants share one chunk body (kernels.pallas.tiles):
  "gpu": Pallas' Triton lowering. Grid (batch*heads, value blocks); each program walks
         its chunks in a fori_loop and keeps the state in registers.
  "tpu": Mosaic TPU. Grid (batch*heads, chunks) with the chunk axis "arbitrary"
         (sequential); the state lives in a VMEM scratch buffer between grid steps.
On a CPU backend both run in interpret mode (how the tests exercise them).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl  # noqa: F401  (re-exported for the kernels)

from kernels.common import pad_axis

# Version-guarded backend modules: jax 0.10 (CPU CI) and 0.11 (the GPU image) both have
# these today; a future jax that drops the Triton lowering only loses the "gpu" variant.
try:
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover - depends on the jax build
    pltriton = None
try:
    from jax.experimental.pallas import tpu as pltpu
except ImportError:  # pragma: no cover
    pltpu = None
# Pallas' lowering imports its fuser lazily (jax 0.11: from einshape), and the fuser
# defines a jax config option that joins jit's tracing context. Imported in the middle of
# the first train step's trace, it changed that context, so every jit cache missed once
# afterwards (the GPU step was traced and compiled twice). Imported here, with the
# kernels (kernels.ops imports them before anything is traced), it is there from the start.
try:
    from jax.experimental.pallas import fuser as _fuser  # noqa: F401
except ImportError:  # pragma: no cover
    _fuser = None

VARIANTS = ("gpu", "tpu")


def backend() -> str:
    return jax.default_backend()


def resolve_variant(variant: str | None) -> str:
    """The kernel variant for this backend unless one is forced (tests force both)."""
    if variant is None:
        return "tpu" if backend() == "tpu" else "gpu"
    if variant not in VARIANTS:
        raise ValueError(f"kernels.pallas: unknown variant {variant!r}; valid: {VARIANTS}")
    if variant == "gpu" and pltriton is None and backend() == "gpu":
        raise NotImplementedError("kernels.pallas: this jax has no Pallas Triton lowering")
    return variant


def interpret() -> bool:
    """Interpret mode wherever there is no accelerator to compile for."""
    return backend() not in ("gpu", "tpu")


def compiler_params(variant: str, *, num_warps: int = 4, num_stages: int = 2,
                    semantics=("parallel", "arbitrary")):
    if interpret():
        return None
    if variant == "gpu":
        return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    return pltpu.CompilerParams(dimension_semantics=tuple(semantics))


def dot_precision(dtype):
    """Full float32 products for float32 operands (Triton and TPU would otherwise use
    TF32 / bf16 passes); bf16 operands need nothing."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def pad_time(x, tp: int, axis: int = 1):
    """Zero-pad the time axis to length tp (zeros make padded steps identities: k = v = 0,
    beta = 0, log-decay = 0)."""
    return pad_axis(x, tp, axis)


MAX_HEAD_DIM = 256  # the largest tile checked on the GPU (scripts/check_head_dims.py)


def check_head_dims(op: str, k_dim: int, v_dim: int, variant: str):
    """Triton tiles must be powers of two (>= 16 for the tensor-core dots), at most
    MAX_HEAD_DIM (unchecked past it; at 256 the sequential kernels' tiles already fit
    shared memory only at 2 pipeline stages)."""
    for name, d in (("key/feature dim", k_dim), ("value dim", v_dim)):
        if d < 16 or d & (d - 1) or d > MAX_HEAD_DIM:
            if variant == "gpu" or not interpret():
                raise NotImplementedError(
                    f"{op}: impl='pallas' needs a power-of-two {name} from 16 to "
                    f"{MAX_HEAD_DIM}, got {d}; use impl='chunk' (kernels.ops pads other "
                    f"dims up to the next power of two)")


def check_chunk_size(op: str, chunk_size: int):
    if not isinstance(chunk_size, int) or chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise NotImplementedError(
            f"{op}: impl='pallas' needs chunk_size a power of two >= 16, got {chunk_size!r}")


def check_inputs(op: str, q, k, v, *, segment_ids, chunk_size: int, variant: str | None):
    """The checks both Pallas entry points share; returns (variant, input dtype)."""
    if segment_ids is not None and tuple(jnp.shape(segment_ids)) != tuple(q.shape[:2]):
        raise ValueError(f"{op}: segment_ids must be (batch, time) = {tuple(q.shape[:2])}, "
                         f"got {tuple(jnp.shape(segment_ids))}")
    variant = resolve_variant(variant)
    check_chunk_size(op, chunk_size)
    check_head_dims(op, q.shape[-1], v.shape[-1], variant)
    dtype = jnp.result_type(q, k, v)
    if dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise NotImplementedError(f"{op}: inputs must be float32/bfloat16/float16, got {dtype}")
    return variant, dtype


def to_chunk_major(x, b: int, h: int):
    """(B, Tp, H, D) -> (B*H, Tp, D): the kernels' layout (one row of programs per head)."""
    tp, d = x.shape[1], x.shape[-1]
    return jnp.transpose(x, (0, 2, 1, 3)).reshape(b * h, tp, d)


def from_chunk_major(x, b: int, h: int):
    """(B*H, Tp, D) -> (B, Tp, H, D)."""
    tp, d = x.shape[1], x.shape[-1]
    return jnp.transpose(x.reshape(b, h, tp, d), (0, 2, 1, 3))


class ChunkSpecs(NamedTuple):
    """BlockSpecs of one chunk on the grid (B, H, chunks), as the chunk-parallel kernels
    (preparation, output pass, gradient pass) use them: token(d) a (B, Tp, H, d) array's
    chunk rows of one head; per_token a (B, Tp, H) one's; per_row a (B, Tp) one's (run
    indices, shared by the heads); rows(d) a head-major (B*H, Tp, d) one's; scalar a
    (B*H, N, 1, 1) one's entry; state(k, v) a (B*H, N, k, v) one's (the chunk-start
    states)."""
    token: Callable
    per_token: object
    per_row: object
    rows: Callable
    scalar: object
    state: Callable


def chunk_specs(h: int, chunk: int) -> ChunkSpecs:
    return ChunkSpecs(
        token=lambda d: pl.BlockSpec((None, chunk, None, d), lambda bi, hi, ni: (bi, ni, hi, 0)),
        per_token=pl.BlockSpec((None, chunk, None), lambda bi, hi, ni: (bi, ni, hi)),
        per_row=pl.BlockSpec((None, chunk), lambda bi, hi, ni: (bi, ni)),
        rows=lambda d: pl.BlockSpec((None, chunk, d), lambda bi, hi, ni: (bi * h + hi, ni, 0)),
        scalar=pl.BlockSpec((None, None, 1, 1), lambda bi, hi, ni: (bi * h + hi, ni, 0, 0)),
        state=lambda k, v: pl.BlockSpec((None, None, k, v),
                                        lambda bi, hi, ni: (bi * h + hi, ni, 0, 0)))


class SequenceSpecs(NamedTuple):
    """BlockSpecs of one head's whole (padded) sequence on the grid (B, H, value blocks), as
    the sequential kernels (forward, state pass, dS pass) use them: token(d) and
    token_block(bv) a (B, Tp, H, .) array's rows of one head (all d columns, or value
    block j); per_token a (B, Tp, H) one's; rows(d) and rows_block(bv) a head-major
    (B*H, Tp, .) one's; chunk_scalars a (B*H, N, 1, 1) one's; state(k, bv) a (B*H, k, V)
    one's value block; states(k, bv) a (B*H, N, k, V) one's (every chunk-start state).
    With packed documents the grid gains a fourth axis, the piece of the row
    (kernels.pallas.documents.piece_bounds); every block spans it whole."""
    token: Callable
    token_block: Callable
    per_token: object
    rows: Callable
    rows_block: Callable
    chunk_scalars: object
    state: Callable
    states: Callable


def sequence_specs(h: int, tp: int, num_chunks: int) -> SequenceSpecs:
    row = lambda bi, hi: bi * h + hi  # noqa: E731
    return SequenceSpecs(
        token=lambda d: pl.BlockSpec((None, tp, None, d),
                                     lambda bi, hi, j, *_: (bi, 0, hi, 0)),
        token_block=lambda bv: pl.BlockSpec((None, tp, None, bv),
                                            lambda bi, hi, j, *_: (bi, 0, hi, j)),
        per_token=pl.BlockSpec((None, tp, None), lambda bi, hi, j, *_: (bi, 0, hi)),
        rows=lambda d: pl.BlockSpec((None, tp, d),
                                    lambda bi, hi, j, *_: (row(bi, hi), 0, 0)),
        rows_block=lambda bv: pl.BlockSpec((None, tp, bv),
                                           lambda bi, hi, j, *_: (row(bi, hi), 0, j)),
        chunk_scalars=pl.BlockSpec((None, num_chunks, 1, 1),
                                   lambda bi, hi, j, *_: (row(bi, hi), 0, 0, 0)),
        state=lambda k, bv: pl.BlockSpec((None, k, bv),
                                         lambda bi, hi, j, *_: (row(bi, hi), 0, j)),
        states=lambda k, bv: pl.BlockSpec((None, num_chunks, k, bv),
                                          lambda bi, hi, j, *_: (row(bi, hi), 0, 0, j)))


def sequential_grid(b: int, h: int, value_blocks: int, bounds, pieces: int):
    """A sequential kernel's grid (B, H, value blocks[, pieces]), and the piece bounds'
    BlockSpecs and arguments to append to its inputs (none for one piece): each program
    reads its batch entry's (B, Q) row of kernels.pallas.documents.piece_bounds."""
    if pieces == 1:
        return (b, h, value_blocks), [], []
    spec = pl.BlockSpec((None, bounds.shape[1]), lambda bi, hi, j, p: (bi, 0))
    return (b, h, value_blocks, pieces), [spec], [bounds]


def piece_walk(bounds_ref, pieces: int, reverse: bool = False):
    """This program's piece of the row, per documents.piece_bounds, as chunk indices
    (lo, first or last written chunk, hi). Forward the walk goes lo..hi and writes from
    lo + 1 (from lo in the first piece); reverse it goes hi..lo and writes from hi - 1
    down (from hi in the last piece)."""
    p = pl.program_id(3)
    lo, hi = bounds_ref[p], bounds_ref[p + 1]
    if reverse:
        return lo, jnp.where(p == pieces - 1, hi, hi - 1), hi
    return lo, jnp.where(p == 0, lo, lo + 1), hi


def recurrence_in_specs(spec: SequenceSpecs, has_w, has_g, kdim, bv, c, with_qp=True,
                        has_key=False):
    """BlockSpecs of a sequential kernel's leading inputs: [w] ut q k p gcl [gam] [gkey]
    (with_qp) or [w] ut k gcl [gam] [gkey] (the state pass)."""
    specs = ([spec.rows(kdim)] if has_w else []) + [spec.rows_block(bv)]
    if with_qp:
        specs += [spec.token(kdim), spec.token(kdim), spec.rows(c)]
    else:
        specs.append(spec.token(kdim))
    specs.append(spec.chunk_scalars)
    return specs + [spec.per_token] * (int(has_g) + int(has_key))
