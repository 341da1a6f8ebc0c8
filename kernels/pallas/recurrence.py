"""The sequential part of every chunkwise linear op, as Pallas kernels with a custom VJP.

Per chunk n (C tokens; S is the (K, V) float32 state before the chunk) the forward is

    Qg  = Q * exp(G),  Kd = K * exp(G_C - G)   (formed in the kernel from q, k and G)
    U   = Ut - W S                 (W = 0 for linear attention: U = V)
    O   = Qg S + P U               (P = (Q K^T) * decay mask)
    S'  = exp(G_C) S + Kd^T U

where Ut, W, P, G_C (gcl) come from a parallel-over-chunks preparation (kernels.pallas.gdn,
kernels.pallas.linear) and G is the in-chunk inclusive cumsum of the log-decays (None:
no decay, Qg = Q, Kd = K). Forming Qg, Kd here instead of reading them saves the
preparation writing 2 K values per token (and nothing is read twice: the kernel reads
q, k where it would have read Qg, Kd). Only this loop over chunks is sequential, so
only it must be a kernel: the state never leaves registers (GPU) or VMEM (TPU).

Backward (recomputing U from the saved chunk-start states, so nothing per token is
stored; dS = dL/dS' is carried from the last chunk to the first):

    dU  = P^T dO + Kd dS'          dS  = exp(G_C) dS' + Qg^T dO - W^T dU
    dUt = dU    dW = -dU S^T    dQg = dO S^T    dP = dO U^T    dKd = U dS'^T
    dG_C = exp(G_C) <S, dS'>,  then  dq = dQg exp(G),  dk = dKd exp(G_C - G),
    dG = <dQg, Qg> - <dKd, Kd>,  dG_C += sum_t <dKd, Kd>.

GPU forward under a gradient (SPLIT_FWD): a state pass (h, U, S' only) + a chunk-parallel
output pass; the backward then reads the saved U instead of recomputing it. With
SEQ_SEGMENTS > 1 the state pass and the dS pass are two-level scans over segments.

GPU backward: two calls. A sequential pass per (head, value block) carries dS and writes dU and
each chunk's dS' (only the first line needs the recurrence); then a pass parallel over
(head, chunk), all value columns per program, forms the K-sided gradients from S, dS'
and dU and applies the decay chain in place (so nothing is summed over value blocks
afterwards and the long sequential loop does 4 matmuls a chunk, not 9). TPU: one call,
grid (head, chunks in reverse), the whole value dim per program; the decay chain is
elementwise XLA (_chain_decay). Saved for the backward: the chunk-start states, (T / C)
K V values per head in the input dtype (every use casts them to it).
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common


# Narrowest value block the adaptive split goes down to (block_v); read when traced.
# 16 rather than 32: 128 programs instead of 64 at B1 H16, GDN fwd 2.23 -> 2.18 ms and
# fwd+bwd 6.22 -> 6.04 ms at T32768 on the H200 (profile_kernels --tune, side by side).
MIN_BLOCK_V = 16


# Triton settings of the two sequential (loop over chunks) GPU kernels, forward and the
# backward's dS pass: warps per program (0: 4 up to a 128 x 64 state slice, else 8) and
# pipeline stages. Read when traced; the environment sets them at import
# (KERNELS_PALLAS_SEQ_WARPS / _STAGES; scripts/profile_kernels.py --tune times them).
SEQ_WARPS = int(os.environ.get("KERNELS_PALLAS_SEQ_WARPS", "0"))
SEQ_STAGES = int(os.environ.get("KERNELS_PALLAS_SEQ_STAGES", "3"))
# block_v narrows the value blocks (down to MIN_BLOCK_V) until the sequential kernels run
# at least this many programs (the H200 has 132 SMs; KERNELS_PALLAS_SEQ_PROGRAMS).
SEQ_PROGRAMS = int(os.environ.get("KERNELS_PALLAS_SEQ_PROGRAMS", "128"))


# Triton settings of the backward's chunk-parallel gradient kernel (_grads_kernel_gpu);
# not yet tuned on the GPU (profile_kernels --tune-seq times 4 warps against 8;
# KERNELS_PALLAS_GRADS_WARPS).
GRADS_WARPS = int(os.environ.get("KERNELS_PALLAS_GRADS_WARPS", "8"))
GRADS_STAGES = 1


def _sequential_params(kdim, bv, stages=None):
    warps = SEQ_WARPS or (4 if kdim * bv <= 8192 else 8)
    if stages is None:
        stages = _fitting_stages(kdim)
    return common.compiler_params("gpu", num_warps=warps, num_stages=stages)


def _fitting_stages(kdim):
    """SEQ_STAGES, or 2 past 128 keys / features: each stage buffers the chunk's q and k
    tiles (C x K), so at K = 256 three stages asked the H200 for 249,856-258,048 bytes
    of shared memory (232,448 there), in Based's linear attention (153 features padded to
    256; docs/results.md). At K <= 128 three stages fit and were timed fastest."""
    return SEQ_STAGES if kdim <= 128 else min(SEQ_STAGES, 2)


class Config(NamedTuple):
    """Static description of one call (hashable: it is a nondiff argument)."""
    chunk: int
    variant: str          # "gpu" | "tpu"
    out_dtype: str        # dtype name of O
    block_v: int          # value columns per program (gpu); the whole V on tpu


def _mm(a, b, *, ta=False, tb=False, precision=None):
    """a @ b with optional transposes, accumulated in float32."""
    dims = (((0,) if ta else (1,), (1,) if tb else (0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision,
                           preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- chunk bodies

def _q_decayed(q, gam):
    """Qg = Q * exp(G) in the input dtype, from the loaded q tile and the float32 in-chunk
    cumulative log-decay G (a (C, 1) column). gam None: no decay, Qg = Q."""
    if gam is None:
        return q
    return (q.astype(jnp.float32) * jnp.exp(gam)).astype(q.dtype)


def _k_decayed(k, gam, gcl):
    """Kd = K * exp(G_C - G) in the input dtype (gam None: Kd = K)."""
    if gam is None:
        return k
    return (k.astype(jnp.float32) * jnp.exp(gcl - gam)).astype(k.dtype)


def _decayed(q, k, gam, gcl):
    """(Qg, Kd), formed here from the loaded tiles rather than read from a preparation
    pass."""
    return _q_decayed(q, gam), _k_decayed(k, gam, gcl)


def _chunk_values(ut, w, sc, prec):
    """The values a chunk writes, U = Ut - W S (U = Ut for linear attention), in the input
    dtype; the backward recomputes them from the saved chunk-start state."""
    u = ut.astype(jnp.float32)
    if w is not None:
        u = u - _mm(w, sc, precision=prec)
    return u.astype(ut.dtype)


def _fwd_chunk(s, w, ut, q, k, p, gcl, gam):
    """One chunk of the forward recurrence; s float32 (K, BV). Returns (o, s_next)."""
    prec = common.dot_precision(ut.dtype)
    sc, uc, s_next = _state_step(s, ut, w, k, gam, gcl, prec)
    o = _mm(_q_decayed(q, gam), sc, precision=prec) + _mm(p, uc, precision=prec)
    return o, s_next


def _bwd_chunk(s, ds, w, ut, q, k, p, gcl, gam, do):
    """Vector-Jacobian product of one chunk (the TPU backward; the GPU splits the same
    math into _dstate_kernel_gpu and _grads_kernel_gpu). s: chunk-start state,
    ds: dL/d(next state).
    Returns (ds_prev, dut, dw, dqg, dkd, dp, dgcl); dqg, dkd are w.r.t. Qg, Kd (the exp
    factors are applied outside, in _chain_decay)."""
    dt = ut.dtype
    prec = common.dot_precision(dt)
    sc = s.astype(dt)
    doc = do.astype(dt)
    uc = _chunk_values(ut, w, sc, prec)
    dsc, du, ds_prev = _dstate_step(ds, w, q, k, p, gam, gcl, doc, prec)
    dw = None if w is None else -_mm(du, sc, tb=True, precision=prec)
    dqg = _mm(doc, sc, tb=True, precision=prec)
    dp = _mm(doc, uc, tb=True, precision=prec)
    dkd = _mm(uc, dsc, tb=True, precision=prec)
    dgcl = jnp.exp(gcl) * jnp.sum(jnp.sum(s * ds, axis=1, keepdims=True), axis=0,
                                  keepdims=True)
    return ds_prev, du, dw, dqg, dkd, dp, dgcl


def _split(refs, has_w, has_g):
    """Kernel refs in call order: [w] ut q k p gcl [gam], then the rest (returned)."""
    refs = list(refs)
    w_ref = refs.pop(0) if has_w else None
    ut_ref, q_ref, k_ref, p_ref, gcl_ref = refs[:5]
    refs = refs[5:]
    g_ref = refs.pop(0) if has_g else None
    return (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref), refs


# ----------------------------------------------------------------------------- layouts

def _layout(q, k, gam, cfg: Config):
    """The kernel-side arrays for q, k, gam. GPU: as given, (B, Tp, H, K) and (B, Tp, H):
    each program reads its head's rows in place (strided), so nothing is transposed.
    TPU: chunk-major (B*H, Tp, K) and G as (B*H, N, C, 1) columns (block shapes there
    must match the array's last two dims)."""
    if cfg.variant == "gpu":
        return q, k, gam
    b, tp, h, _ = q.shape
    q, k = common.to_chunk_major(q, b, h), common.to_chunk_major(k, b, h)
    if gam is not None:
        gam = jnp.transpose(gam, (0, 2, 1)).reshape(b * h, tp // cfg.chunk, cfg.chunk, 1)
    return q, k, gam


def _gpu_in_specs(has_w, has_g, h, tp, kdim, bv, c, n):
    """BlockSpecs for [w] ut q k p gcl [gam] on the GPU grid (B, H, value blocks)."""
    row = lambda bi, hi: bi * h + hi  # noqa: E731
    kspec = pl.BlockSpec((None, tp, kdim), lambda bi, hi, j: (row(bi, hi), 0, 0))
    tok = pl.BlockSpec((None, tp, None, kdim), lambda bi, hi, j: (bi, 0, hi, 0))
    specs = ([kspec] if has_w else []) + [
        pl.BlockSpec((None, tp, bv), lambda bi, hi, j: (row(bi, hi), 0, j)), tok, tok,
        pl.BlockSpec((None, tp, c), lambda bi, hi, j: (row(bi, hi), 0, 0)),
        pl.BlockSpec((None, n, 1, 1), lambda bi, hi, j: (row(bi, hi), 0, 0, 0))]
    if has_g:
        specs.append(pl.BlockSpec((None, tp, None), lambda bi, hi, j: (bi, 0, hi)))
    return specs


def _gpu_token_spec(tp, bv):
    """One head's value block of a (B, Tp, H, V) array (O, dO) on the grid (B, H, blocks)."""
    return pl.BlockSpec((None, tp, None, bv), lambda bi, hi, j: (bi, 0, hi, j))


def _tpu_in_specs(has_w, has_g, kdim, vdim, c, chunk_index):
    """BlockSpecs for [w] ut q k p gcl [gam] on the TPU grid (B*H, chunks)."""
    ci = chunk_index
    kspec = pl.BlockSpec((None, c, kdim), lambda i, j: (i, ci(j), 0))
    specs = ([kspec] if has_w else []) + [
        pl.BlockSpec((None, c, vdim), lambda i, j: (i, ci(j), 0)), kspec, kspec,
        pl.BlockSpec((None, c, c), lambda i, j: (i, ci(j), 0)),
        pl.BlockSpec((None, None, 1, 1), lambda i, j: (i, ci(j), 0, 0))]
    if has_g:
        specs.append(pl.BlockSpec((None, None, c, 1), lambda i, j: (i, ci(j), 0, 0)))
    return specs


# ----------------------------------------------------------------------------- forward kernels

def _fwd_kernel_gpu(*refs, has_w, has_g, save, chunk, num_chunks):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref), rest = _split(refs, has_w, has_g)
    s0_ref, o_ref, st_ref, *rest = rest
    h_ref = rest[0] if save else None

    def body(n, s):
        rows = pl.ds(n * chunk, chunk)
        if save:
            h_ref[n] = s.astype(h_ref.dtype)
        w = w_ref[rows, :] if has_w else None
        gam = g_ref[rows][:, None] if has_g else None
        o, s = _fwd_chunk(s, w, ut_ref[rows, :], q_ref[rows, :], k_ref[rows, :],
                          p_ref[rows, :], gcl_ref[n], gam)
        o_ref[rows, :] = o.astype(o_ref.dtype)
        return s

    st_ref[...] = lax.fori_loop(0, num_chunks, body, s0_ref[...])


def _fwd_kernel_tpu(*refs, has_w, has_g, save):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref), rest = _split(refs, has_w, has_g)
    s0_ref, o_ref, st_ref, *rest = rest
    h_ref, s_scr = (rest[0], rest[1]) if save else (None, rest[0])
    n = pl.program_id(1)

    @pl.when(n == 0)
    def _():
        s_scr[...] = s0_ref[...]

    s = s_scr[...]
    if save:
        h_ref[...] = s.astype(h_ref.dtype)
    o, s = _fwd_chunk(s, w_ref[...] if has_w else None, ut_ref[...], q_ref[...],
                      k_ref[...], p_ref[...], gcl_ref[...],
                      g_ref[...] if has_g else None)
    o_ref[...] = o.astype(o_ref.dtype)
    s_scr[...] = s

    @pl.when(n == pl.num_programs(1) - 1)
    def _():
        st_ref[...] = s


def _forward(w, ut, q, k, p, gcl, gam, s0, cfg: Config, save: bool):
    b, tp, h, kdim = q.shape
    bh = b * h
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    has_w, has_g = w is not None, gam is not None
    o_shape = (b, tp, h, vdim) if cfg.variant == "gpu" else (bh, tp, vdim)
    out_shapes = [jax.ShapeDtypeStruct(o_shape, jnp.dtype(cfg.out_dtype)),
                  jax.ShapeDtypeStruct((bh, kdim, vdim), jnp.float32)]
    if save:  # chunk-start states, in the input dtype: every use casts them to it first
        out_shapes.append(jax.ShapeDtypeStruct((bh, n, kdim, vdim), ut.dtype))
    if _split_forward(cfg, save):
        return _forward_split_gpu(w, ut, q, k, p, gcl, gam, s0, cfg, save)
    qx, kx, gx = _layout(q, k, gam, cfg)
    args = ([w] if has_w else []) + [ut, qx, kx, p, gcl] + ([gx] if has_g else []) + [s0]

    if cfg.variant == "gpu":
        bv = cfg.block_v
        row = lambda bi, hi: bi * h + hi  # noqa: E731
        sspec = pl.BlockSpec((None, kdim, bv), lambda bi, hi, j: (row(bi, hi), 0, j))
        in_specs = _gpu_in_specs(has_w, has_g, h, tp, kdim, bv, c, n) + [sspec]
        out_specs = [_gpu_token_spec(tp, bv), sspec]   # O in the inputs' (B, Tp, H, V)
        if save:
            out_specs.append(pl.BlockSpec((None, n, kdim, bv),
                                          lambda bi, hi, j: (row(bi, hi), 0, 0, j)))
        kernel = functools.partial(_fwd_kernel_gpu, has_w=has_w, has_g=has_g, save=save,
                                   chunk=c, num_chunks=n)
        outs = pl.pallas_call(
            kernel, grid=(b, h, vdim // bv), in_specs=in_specs, out_specs=out_specs,
            out_shape=out_shapes, interpret=common.interpret(),
            compiler_params=_sequential_params(kdim, bv),
            name="linear_chunk_fwd")(*args)
        return [*outs, None] if save else outs

    vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, j, 0))
    sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
    in_specs = _tpu_in_specs(has_w, has_g, kdim, vdim, c, lambda j: j) + [sspec]
    out_specs = [vspec, sspec]
    if save:
        out_specs.append(pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, j, 0, 0)))
    kernel = functools.partial(_fwd_kernel_tpu, has_w=has_w, has_g=has_g, save=save)
    o, *rest = pl.pallas_call(
        kernel, grid=(bh, n), in_specs=in_specs, out_specs=out_specs, out_shape=out_shapes,
        scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
        interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
        name="linear_chunk_fwd")(*args)
    return [common.from_chunk_major(o, b, h), *rest] + ([None] if save else [])


# ----------------------------------------------------------------------------- split forward (GPU)

# The GPU forward as two calls: a sequential state pass that carries S, writing each
# chunk-start state and U = Ut - W S (2 matmuls a chunk on the critical path, 1 for
# linear attention: U = V), then an output pass parallel over (head, chunk),
# O = Qg S + P U. The one-call forward does all 4 matmuls inside the loop. With few heads
# (B1 H16: 128 programs, one per SM) the loop is latency-bound, so its length per chunk
# is what counts. The split costs writing and reading the chunk-start states; under a
# gradient they are written anyway, and U is then saved for the backward (which would
# otherwise recompute it). On the H200 (profile_kernels / bench_kernels, side by side):
# under a gradient GDN fwd+bwd 2.28 -> 2.18 ms at B2 T8192 and 5.15 -> 4.85 ms at
# B1 T32768; without one, GDN fwd 0.645 -> 0.716 ms at B2 T8192 (worse) and 1.001 ->
# 1.004 ms of recurrence at B1 T32768 (even), linear attention fwd 0.495 -> 0.558 ms at
# B8 T2048 (worse). So "grad" (the default): split only in the VJP's forward. Read when
# traced; KERNELS_PALLAS_SPLIT_FWD = grad | always | never.
SPLIT_FWD_CHOICES = ("grad", "always", "never")
SPLIT_FWD = os.environ.get("KERNELS_PALLAS_SPLIT_FWD", "grad")


def _split_forward(cfg: Config, save: bool) -> bool:
    common.check_switch("recurrence.SPLIT_FWD", "KERNELS_PALLAS_SPLIT_FWD", SPLIT_FWD,
                        SPLIT_FWD_CHOICES)
    # the two-level scan (SEQ_SEGMENTS) is a form of the split forward's state pass
    return cfg.variant == "gpu" and (SPLIT_FWD == "always" or (SPLIT_FWD == "grad" and save)
                                     or SEQ_SEGMENTS > 1)


def _state_step(s, ut, w, k, gam, gcl, prec):
    """One chunk of the state pass: (S in the input dtype, U = Ut - W S,
    S' = e^G_C S + Kd^T U); s float32 (K, BV)."""
    sc = s.astype(ut.dtype)
    uc = _chunk_values(ut, w, sc, prec)
    return sc, uc, jnp.exp(gcl) * s + _mm(_k_decayed(k, gam, gcl), uc, ta=True, precision=prec)


def _identity_columns(kdim, block_v, j, value_blocks):
    """(initial state, 0/1 weight of the chunk inputs) of column block j in a segment-map
    pass: value blocks (j < value_blocks) start from 0 with their inputs, the K identity
    columns after them from I's columns with none (their end state is the segment's
    transition A_g)."""
    # 0/1 as int arithmetic, not a select on a scalar bool (which Pallas' Triton lowering
    # broadcasts to an i1 tensor it then cannot multiply)
    keep = jnp.clip(value_blocks - j, 0, 1)
    rows = lax.broadcasted_iota(jnp.int32, (kdim, block_v), 0)
    cols = lax.broadcasted_iota(jnp.int32, (kdim, block_v), 1) + (j - value_blocks) * block_v
    s0 = (rows == cols).astype(jnp.float32) * (1 - keep).astype(jnp.float32)
    return s0, keep.astype(jnp.float32)


def _state_kernel_gpu(*refs, has_w, has_g, chunk, num_chunks):
    """Split forward, pass 1 (sequential): h[n] = S, U = Ut - W S, S' = e^G_C S + Kd^T U."""
    refs = list(refs)
    w_ref = refs.pop(0) if has_w else None
    ut_ref, k_ref, gcl_ref = refs[:3]
    refs = refs[3:]
    g_ref = refs.pop(0) if has_g else None
    s0_ref, st_ref, h_ref, *rest = refs
    u_ref = rest[0] if has_w else None
    dt = ut_ref.dtype
    prec = common.dot_precision(dt)

    def body(n, s):
        rows = pl.ds(n * chunk, chunk)
        gam = g_ref[rows][:, None] if has_g else None
        sc, uc, s = _state_step(s, ut_ref[rows, :], w_ref[rows, :] if has_w else None,
                                k_ref[rows, :], gam, gcl_ref[n], prec)
        h_ref[n] = sc
        if has_w:
            u_ref[rows, :] = uc
        return s

    st_ref[...] = lax.fori_loop(0, num_chunks, body, s0_ref[...])


def _output_kernel_gpu(*refs, has_g, block_cols):
    """Split forward, pass 2: one program per (batch, head, chunk), O = Qg S + P U."""
    refs = list(refs)
    q_ref, p_ref = refs[:2]
    refs = refs[2:]
    g_ref = refs.pop(0) if has_g else None
    h_ref, u_ref, o_ref = refs
    dt = u_ref.dtype
    prec = common.dot_precision(dt)
    gam = g_ref[...][:, None] if has_g else None
    qg = _q_decayed(q_ref[...], gam)
    p = p_ref[...]
    for j in range(u_ref.shape[-1] // block_cols):   # static: value columns in blocks
        cols = pl.ds(j * block_cols, block_cols)
        o = _mm(qg, h_ref[:, cols], precision=prec) + _mm(p, u_ref[:, cols], precision=prec)
        o_ref[:, cols] = o.astype(o_ref.dtype)


# Two-level scan of the split forward's state pass (GPU) and, the same way, of the
# backward's dS pass (_dstate_segment_ends), SEQ_SEGMENTS = G > 1: the
# chunks are cut into G contiguous segments (G the largest divisor of the chunk count
# that is <= SEQ_SEGMENTS). Pass 1 runs every segment from a zero state on the value
# columns and from the identity on K extra columns, in parallel, giving each segment's
# affine map S_end = A_g S_start + E_g (A_g: K x K, the product of the chunk transitions
# e^G_C I - Kd^T W); a G-step scan in XLA chains them into each segment's start state;
# then the state pass runs all segments in parallel from those. Twice the loop work of
# one pass in all, but G times the programs, for the case where the one loop is bound by
# its length (B1 H16 T32768: 512 chunks, 128 programs on 132 SMs). Read when traced
# (KERNELS_PALLAS_SEQ_SEGMENTS); 1 (off) until timed on a GPU.
SEQ_SEGMENTS = int(os.environ.get("KERNELS_PALLAS_SEQ_SEGMENTS", "1"))
# Pipeline stages of the segmented loops: fewer than the one loop's, since their latency
# is meant to be hidden by other programs on the SM, and each stage's buffers (~34 KB of
# W, K and Ut rows at K128) limit how many programs fit (KERNELS_PALLAS_SEG_STAGES).
SEG_STAGES = int(os.environ.get("KERNELS_PALLAS_SEG_STAGES", "1"))


def _segments(num_chunks: int) -> int:
    """The segment count used: the largest divisor of num_chunks <= SEQ_SEGMENTS."""
    return max(d for d in range(1, max(1, min(SEQ_SEGMENTS, num_chunks)) + 1)
               if num_chunks % d == 0)


def _segment_maps_kernel(*refs, has_w, has_g, chunk, num_chunks, value_blocks, block_v):
    """Pass 1 of the two-level scan, one (head, segment, column block): value blocks
    start from 0 with Ut, identity blocks (j >= value_blocks) from columns of I with no
    Ut; both run S' = e^G_C S + Kd^T (Ut - W S) over the segment's chunks and write S."""
    refs = list(refs)
    w_ref = refs.pop(0) if has_w else None
    ut_ref, k_ref, gcl_ref = refs[:3]
    refs = refs[3:]
    g_ref = refs.pop(0) if has_g else None
    (end_ref,) = refs
    dt = ut_ref.dtype
    prec = common.dot_precision(dt)
    s0, keep = _identity_columns(k_ref.shape[-1], block_v, pl.program_id(3), value_blocks)

    def body(n, s):
        rows = pl.ds(n * chunk, chunk)
        gam = g_ref[rows][:, None] if has_g else None
        ut = (ut_ref[rows, :].astype(jnp.float32) * keep).astype(dt)
        return _state_step(s, ut, w_ref[rows, :] if has_w else None, k_ref[rows, :], gam,
                           gcl_ref[n], prec)[2]

    end_ref[...] = lax.fori_loop(0, num_chunks, body, s0)


def _seg_in_specs(has_w, has_g, nh, seg_t, kdim, bv, c, vb=lambda j: j, with_qp=True):
    """BlockSpecs for [w] ut q k p gcl [gam] (the dS passes) or, with_qp False,
    [w] ut k gcl [gam] (the state passes), on the grid (B, H, segments, value blocks): one
    segment's seg_t rows of each; vb maps the grid's value block to Ut's."""
    row = lambda bi, hi: bi * nh + hi  # noqa: E731
    tok = pl.BlockSpec((None, seg_t, None, kdim), lambda bi, hi, g, j: (bi, g, hi, 0))
    specs = ([pl.BlockSpec((None, seg_t, kdim), lambda bi, hi, g, j: (row(bi, hi), g, 0))]
             if has_w else [])
    specs.append(pl.BlockSpec((None, seg_t, bv), lambda bi, hi, g, j: (row(bi, hi), g, vb(j))))
    if with_qp:
        specs += [tok, tok,
                  pl.BlockSpec((None, seg_t, c), lambda bi, hi, g, j: (row(bi, hi), g, 0))]
    else:
        specs.append(tok)
    specs.append(pl.BlockSpec((None, seg_t // c, 1, 1),
                              lambda bi, hi, g, j: (row(bi, hi), g, 0, 0)))
    if has_g:
        specs.append(pl.BlockSpec((None, seg_t, None), lambda bi, hi, g, j: (bi, g, hi)))
    return specs


def _chain_segments(ends, vdim, carry, reverse=False):
    """The carry at each segment's entry (BH, G, K, V) float32, from the segment-map
    pass's ends (BH, G, K, V + K): [E_g | A_g], exit = A_g entry + E_g, segments taken
    first to last from carry (the initial state), or last to first (reverse: the dS
    passes, carry = the gradient after the last segment)."""
    e_g, a_g = ends[..., :vdim], ends[..., vdim:]

    def step(entry, x):
        a, e = x
        return jnp.einsum("bij,bjv->biv", a, entry, precision=lax.Precision.HIGHEST) + e, entry
    _, entries = lax.scan(step, carry, (jnp.moveaxis(a_g, 1, 0), jnp.moveaxis(e_g, 1, 0)),
                          reverse=reverse)
    return jnp.moveaxis(entries, 0, 1)


def _identity_blocks(kdim, bv):
    """Column blocks of the K identity columns a segment-map pass adds."""
    if kdim % bv:
        raise NotImplementedError(f"SEQ_SEGMENTS needs K ({kdim}) a multiple of the value "
                                  f"block ({bv})")
    return kdim // bv


def _segment_starts(w, ut, k, gcl, gam, s0, cfg: Config, segs: int):
    """Each segment's start state (BH, G, K, V) float32, by pass 1 and a G-step scan."""
    b, tp, nh, kdim = k.shape
    bh = b * nh
    vdim = ut.shape[-1]
    c = cfg.chunk
    seg_t = tp // segs                      # tokens per segment
    bv = cfg.block_v
    nvb = vdim // bv
    has_w, has_g = w is not None, gam is not None
    row = lambda bi, hi: bi * nh + hi  # noqa: E731
    vb = lambda j: jnp.minimum(j, nvb - 1)  # noqa: E731  (identity blocks read a dummy Ut)
    args = ([w] if has_w else []) + [ut, k, gcl] + ([gam] if has_g else [])
    ends = pl.pallas_call(
        functools.partial(_segment_maps_kernel, has_w=has_w, has_g=has_g, chunk=c,
                          num_chunks=seg_t // c, value_blocks=nvb, block_v=bv),
        grid=(b, nh, segs, nvb + _identity_blocks(kdim, bv)),
        in_specs=_seg_in_specs(has_w, has_g, nh, seg_t, kdim, bv, c, vb, with_qp=False),
        out_specs=pl.BlockSpec((None, None, kdim, bv),
                               lambda bi, hi, g, j: (row(bi, hi), g, 0, j)),
        out_shape=jax.ShapeDtypeStruct((bh, segs, kdim, vdim + kdim), jnp.float32),
        interpret=common.interpret(), compiler_params=_sequential_params(kdim, bv, SEG_STAGES),
        name="linear_chunk_fwd_segment_maps")(*args)
    return _chain_segments(ends, vdim, s0)


def _forward_split_gpu(w, ut, q, k, p, gcl, gam, s0, cfg: Config, save: bool):
    """The GPU forward as a state pass and an output pass (SPLIT_FWD), the state pass
    over SEQ_SEGMENTS segments in parallel when that is > 1; same returns as _forward,
    with save also U = Ut - W S (None for linear attention, where U = Ut)."""
    b, tp, nh, kdim = q.shape
    bh = b * nh
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    dt = ut.dtype
    has_w, has_g = w is not None, gam is not None
    bv = cfg.block_v
    segs = _segments(n)
    seg_t, seg_n = tp // segs, n // segs
    row = lambda bi, hi: bi * nh + hi  # noqa: E731
    if segs > 1:
        starts = _segment_starts(w, ut, k, gcl, gam, s0, cfg, segs)
    else:
        starts = s0[:, None]

    # pass 1: states and U, sequential within a segment; grid (B, H, segments, value blocks)
    vspec = pl.BlockSpec((None, seg_t, bv), lambda bi, hi, g, j: (row(bi, hi), g, j))
    sspec = pl.BlockSpec((None, None, kdim, bv), lambda bi, hi, g, j: (row(bi, hi), g, 0, j))
    in_specs = _seg_in_specs(has_w, has_g, nh, seg_t, kdim, bv, c, with_qp=False)
    out_specs = [sspec, pl.BlockSpec((None, seg_n, kdim, bv),
                                     lambda bi, hi, g, j: (row(bi, hi), g, 0, j))]
    out_shape = [jax.ShapeDtypeStruct((bh, segs, kdim, vdim), jnp.float32),
                 jax.ShapeDtypeStruct((bh, n, kdim, vdim), dt)]
    if has_w:
        out_specs.append(vspec)
        out_shape.append(jax.ShapeDtypeStruct((bh, tp, vdim), dt))
    args = ([w] if has_w else []) + [ut, k, gcl] + ([gam] if has_g else []) + [starts]
    ends, h, *rest = pl.pallas_call(
        functools.partial(_state_kernel_gpu, has_w=has_w, has_g=has_g, chunk=c,
                          num_chunks=seg_n),
        grid=(b, nh, segs, vdim // bv), in_specs=in_specs + [sspec], out_specs=out_specs,
        out_shape=out_shape, interpret=common.interpret(),
        compiler_params=_sequential_params(kdim, bv, SEG_STAGES if segs > 1 else None),
        name="linear_chunk_fwd_states")(*args)
    st = ends[:, -1]
    u = rest[0] if has_w else ut

    # pass 2: outputs, parallel over chunks; grid (B, H, chunks)
    spec = common.chunk_specs(nh, c)
    in_specs = ([spec.token(kdim), spec.rows(c)] + ([spec.per_token] if has_g else [])
                + [spec.state(kdim, vdim), spec.rows(vdim)])
    o = pl.pallas_call(
        functools.partial(_output_kernel_gpu, has_g=has_g, block_cols=min(vdim, 64)),
        grid=(b, nh, n), in_specs=in_specs, out_specs=spec.token(vdim),
        out_shape=jax.ShapeDtypeStruct((b, tp, nh, vdim), jnp.dtype(cfg.out_dtype)),
        interpret=common.interpret(),
        compiler_params=common.compiler_params("gpu", num_warps=OUTPUT_WARPS,
                                               num_stages=1),
        name="linear_chunk_fwd_output")(q, p, *([gam] if has_g else []), h, u)
    return [o, st, h, rest[0] if has_w else None] if save else [o, st]


# Warps of the split forward's output kernel (KERNELS_PALLAS_OUTPUT_WARPS; untuned).
OUTPUT_WARPS = int(os.environ.get("KERNELS_PALLAS_OUTPUT_WARPS", "4"))


# ----------------------------------------------------------------------------- backward kernels

def _dstate_step(ds, w, q, k, p, gam, gcl, doc, prec):
    """One chunk of the dS pass, last to first: (dS' in the input dtype,
    dU = P^T dO + Kd dS', dS = e^G_C dS' + Qg^T dO - W^T dU); ds float32 (K, BV)."""
    dt = doc.dtype
    qg, kd = _decayed(q, k, gam, gcl)
    dsc = ds.astype(dt)
    du = (_mm(p, doc, ta=True, precision=prec) + _mm(kd, dsc, precision=prec)).astype(dt)
    ds = jnp.exp(gcl) * ds + _mm(qg, doc, ta=True, precision=prec)
    if w is not None:
        ds = ds - _mm(w, du, ta=True, precision=prec)
    return dsc, du, ds


def _dstate_kernel_gpu(*refs, has_w, has_g, chunk, num_chunks):
    """GPU backward, pass 1 (sequential over chunks, last to first): carries dS, writing
    per chunk dU = P^T dO + Kd dS' and dS' itself (dh: the gradient w.r.t. the state after
    the chunk). Nothing here needs the forward's states, and nothing K-sided is summed
    over value blocks: the rest of the gradient is chunk-parallel (_grads_kernel_gpu)."""
    (w_ref, _, q_ref, k_ref, p_ref, gcl_ref, g_ref), rest = _split(refs, has_w, has_g)
    do_ref, dst_ref, du_ref, dh_ref, ds0_ref = rest
    dt = du_ref.dtype
    prec = common.dot_precision(dt)

    def body(i, ds):
        n = num_chunks - 1 - i
        rows = pl.ds(n * chunk, chunk)
        gam = g_ref[rows][:, None] if has_g else None
        dsc, du, ds = _dstate_step(ds, w_ref[rows, :] if has_w else None, q_ref[rows, :],
                                   k_ref[rows, :], p_ref[rows, :], gam, gcl_ref[n],
                                   do_ref[rows, :].astype(dt), prec)
        dh_ref[n] = dsc
        du_ref[rows, :] = du
        return ds

    ds0_ref[...] = lax.fori_loop(0, num_chunks, body, dst_ref[...])


def _dstate_maps_kernel(*refs, has_w, has_g, chunk, num_chunks, value_blocks, block_v):
    """The dS pass's segment maps (SEQ_SEGMENTS), one (head, segment, column block): the
    pass over the segment's chunks from 0 with dO (value blocks) or from I's columns with
    no dO (identity blocks), writing only where it ends: dS_start = A_g dS_end + E_g."""
    (w_ref, _, q_ref, k_ref, p_ref, gcl_ref, g_ref), (do_ref, end_ref) = _split(
        refs, has_w, has_g)
    dt = k_ref.dtype
    prec = common.dot_precision(dt)
    s0, keep = _identity_columns(k_ref.shape[-1], block_v, pl.program_id(3), value_blocks)

    def body(i, ds):
        rows = pl.ds((num_chunks - 1 - i) * chunk, chunk)
        gam = g_ref[rows][:, None] if has_g else None
        doc = (do_ref[rows, :].astype(jnp.float32) * keep).astype(dt)
        return _dstate_step(ds, w_ref[rows, :] if has_w else None, q_ref[rows, :],
                            k_ref[rows, :], p_ref[rows, :], gam,
                            gcl_ref[num_chunks - 1 - i], doc, prec)[2]

    end_ref[...] = lax.fori_loop(0, num_chunks, body, s0)


def _dstate_segment_ends(lead, do, dst, cfg: Config, segs: int, *, has_w, has_g):
    """dS' after each segment (BH, G, K, V) float32 (the last one is dst): the segment
    maps of the dS pass and a G-step scan from the last segment to the first. lead:
    [w] ut q k p gcl [gam] as the dS pass takes them; do (B, Tp, H, V); dst (BH, K, V)."""
    b, tp, nh, vdim = do.shape
    kdim = dst.shape[1]
    bv = cfg.block_v
    nvb = vdim // bv
    seg_t = tp // segs
    vb = lambda j: jnp.minimum(j, nvb - 1)  # noqa: E731  (identity blocks: a dummy dO)
    row = lambda bi, hi: bi * nh + hi  # noqa: E731
    ends = pl.pallas_call(
        functools.partial(_dstate_maps_kernel, has_w=has_w, has_g=has_g, chunk=cfg.chunk,
                          num_chunks=seg_t // cfg.chunk, value_blocks=nvb, block_v=bv),
        grid=(b, nh, segs, nvb + _identity_blocks(kdim, bv)),
        in_specs=_seg_in_specs(has_w, has_g, nh, seg_t, kdim, bv, cfg.chunk, vb) + [
            pl.BlockSpec((None, seg_t, None, bv), lambda bi, hi, g, j: (bi, g, hi, vb(j)))],
        out_specs=pl.BlockSpec((None, None, kdim, bv),
                               lambda bi, hi, g, j: (row(bi, hi), g, 0, j)),
        out_shape=jax.ShapeDtypeStruct((b * nh, segs, kdim, vdim + kdim), jnp.float32),
        interpret=common.interpret(), compiler_params=_sequential_params(kdim, bv, SEG_STAGES),
        name="linear_chunk_bwd_segment_maps")(*lead, do)
    return _chain_segments(ends, vdim, dst, reverse=True)


def _grads_kernel_gpu(*refs, has_w, has_g, u_saved, block_cols):
    """GPU backward, pass 2: one program per (batch, head, chunk), all value columns
    (in blocks of block_cols). From the chunk-start state S (saved by the forward), dS'
    and dU (pass 1), with U = Ut - W S recomputed:

        dQg = dO S^T   dKd = U dS'^T   dW = -dU S^T   dP = dO U^T   dG_C = e^G_C <S, dS'>

    then the decay chain in place: dq = dQg e^G, dk = dKd e^(G_C - G),
    dG = <dq, q> - <dk, k>, dG_C += sum_t <dk, k>. u_saved: the ut slot holds U itself
    (written by the split forward), so neither W nor a matmul is needed for it."""
    (w_ref, ut_ref, q_ref, k_ref, _, gcl_ref, g_ref), rest = _split(refs, has_w, has_g)
    h_ref, dh_ref, do_ref, du_ref, dq_ref, dk_ref, *rest = rest
    dw_ref = rest.pop(0) if has_w else None
    dp_ref, dgcl_ref, *rest = rest
    dg_ref = rest[0] if has_g else None
    f32 = jnp.float32
    dt = ut_ref.dtype
    prec = common.dot_precision(dt)
    c, kdim = q_ref.shape
    vdim = ut_ref.shape[-1]
    w = w_ref[...] if has_w and not u_saved else None
    dqg = jnp.zeros((c, kdim), f32)
    dkd = jnp.zeros((c, kdim), f32)
    dw = jnp.zeros((c, kdim), f32)
    dp = jnp.zeros((c, c), f32)
    sds = jnp.zeros((1, 1), f32)
    for j in range(vdim // block_cols):     # static: value columns in blocks
        cols = pl.ds(j * block_cols, block_cols)
        sc, dsc = h_ref[:, cols], dh_ref[:, cols]
        doc = do_ref[:, cols].astype(dt)
        uc = ut_ref[:, cols] if u_saved else _chunk_values(ut_ref[:, cols], w, sc, prec)
        dqg += _mm(doc, sc, tb=True, precision=prec)
        dp += _mm(doc, uc, tb=True, precision=prec)
        dkd += _mm(uc, dsc, tb=True, precision=prec)
        if has_w:
            dw -= _mm(du_ref[:, cols], sc, tb=True, precision=prec)
        sds += jnp.sum(jnp.sum(sc.astype(f32) * dsc.astype(f32), axis=1, keepdims=True),
                       axis=0, keepdims=True)
    gcl = gcl_ref[...]
    dgcl = jnp.exp(gcl) * sds
    if has_g:
        gam = g_ref[...][:, None]
        dq = dqg * jnp.exp(gam)
        dk = dkd * jnp.exp(gcl - gam)
        tq = jnp.sum(dq * q_ref[...].astype(f32), axis=1)
        tk = jnp.sum(dk * k_ref[...].astype(f32), axis=1)
        dg_ref[...] = tq - tk
        dgcl = dgcl + jnp.sum(tk)
    else:
        dq, dk = dqg, dkd
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    if has_w:
        dw_ref[...] = dw.astype(dw_ref.dtype)
    dp_ref[...] = dp.astype(dp_ref.dtype)
    dgcl_ref[...] = dgcl


def _backward_gpu(w, ut, q, k, p, gcl, gam, h, do, dst, cfg: Config, u=None):
    """The GPU backward as two Pallas calls (see the two kernels). u: U = Ut - W S as the
    forward wrote it (then ut may be None), else recomputed from ut, w and the states.
    Returns (dw | None, dut, dq, dk, dp, dgcl, dgam | None, ds0) with dq, dk as
    (B, Tp, H, K) in the input dtype and the decay chain applied."""
    u_saved = u is not None
    ut = u if u_saved else ut
    b, tp, nh, kdim = q.shape
    bh = b * nh
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    dt = ut.dtype
    has_w, has_g = w is not None, gam is not None
    bv = cfg.block_v
    row = lambda bi, hi: bi * nh + hi  # noqa: E731
    lead = ([w] if has_w else []) + [ut, q, k, p, gcl] + ([gam] if has_g else [])

    # pass 1: dU and dS' per chunk, sequential within a segment (SEQ_SEGMENTS; one
    # segment unless set); grid (B, H, segments, value blocks)
    segs = _segments(n)
    seg_t, seg_n = tp // segs, n // segs
    if segs > 1:
        afters = _dstate_segment_ends(lead, do, dst, cfg, segs, has_w=has_w, has_g=has_g)
    else:
        afters = dst[:, None]
    vspec = pl.BlockSpec((None, seg_t, bv), lambda bi, hi, g, j: (row(bi, hi), g, j))
    sspec = pl.BlockSpec((None, None, kdim, bv), lambda bi, hi, g, j: (row(bi, hi), g, 0, j))
    du, dh, ds0 = pl.pallas_call(
        functools.partial(_dstate_kernel_gpu, has_w=has_w, has_g=has_g, chunk=c,
                          num_chunks=seg_n),
        grid=(b, nh, segs, vdim // bv),
        in_specs=(_seg_in_specs(has_w, has_g, nh, seg_t, kdim, bv, c)
                  + [pl.BlockSpec((None, seg_t, None, bv),
                                  lambda bi, hi, g, j: (bi, g, hi, j)), sspec]),
        out_specs=[vspec, pl.BlockSpec((None, seg_n, kdim, bv),
                                       lambda bi, hi, g, j: (row(bi, hi), g, 0, j)), sspec],
        out_shape=[jax.ShapeDtypeStruct((bh, tp, vdim), dt),
                   jax.ShapeDtypeStruct((bh, n, kdim, vdim), dt),
                   jax.ShapeDtypeStruct((bh, segs, kdim, vdim), jnp.float32)],
        interpret=common.interpret(),
        compiler_params=_sequential_params(kdim, bv, SEG_STAGES if segs > 1 else None),
        name="linear_chunk_bwd_dstate")(*lead, do, afters)
    ds0 = ds0[:, 0]

    # pass 2: everything else, parallel over chunks; grid (B, H, chunks)
    spec = common.chunk_specs(nh, c)
    crow, tok, one, gspec = spec.rows, spec.token(kdim), spec.scalar, spec.per_token
    state = spec.state(kdim, vdim)
    in_specs = (([crow(kdim)] if has_w else []) + [crow(vdim), tok, tok, crow(c), one]
                + ([gspec] if has_g else []) + [state, state, spec.token(vdim), crow(vdim)])
    out_specs = [tok, tok] + ([crow(kdim)] if has_w else []) + [crow(c), one] + (
        [gspec] if has_g else [])
    out_shape = ([jax.ShapeDtypeStruct(q.shape, q.dtype)] * 2
                 + ([jax.ShapeDtypeStruct((bh, tp, kdim), dt)] if has_w else [])
                 + [jax.ShapeDtypeStruct((bh, tp, c), dt),
                    jax.ShapeDtypeStruct((bh, n, 1, 1), jnp.float32)]
                 + ([jax.ShapeDtypeStruct((b, tp, nh), jnp.float32)] if has_g else []))
    outs = pl.pallas_call(
        functools.partial(_grads_kernel_gpu, has_w=has_w, has_g=has_g, u_saved=u_saved,
                          block_cols=min(vdim, 64)),
        grid=(b, nh, n), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        interpret=common.interpret(),
        compiler_params=common.compiler_params("gpu", num_warps=GRADS_WARPS,
                                               num_stages=GRADS_STAGES),
        name="linear_chunk_bwd_grads")(*lead, h, dh, do, du)
    dq, dk, *outs = outs
    dw = outs.pop(0) if has_w else None
    dp, dgcl, *outs = outs
    dgam = outs[0] if has_g else None
    return dw, du, dq, dk, dp, dgcl, dgam, ds0


def _bwd_kernel_tpu(*refs, has_w, has_g):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref), rest = _split(refs, has_w, has_g)
    h_ref, do_ref, dst_ref, dut_ref, *rest = rest
    if has_w:
        dw_ref, *rest = rest
    dqg_ref, dkd_ref, dp_ref, dgcl_ref, ds0_ref, ds_scr = rest
    i = pl.program_id(1)

    @pl.when(i == 0)
    def _():
        ds_scr[...] = dst_ref[...]

    ds, du, dw, dqg, dkd, dp, dgcl = _bwd_chunk(
        h_ref[...], ds_scr[...], w_ref[...] if has_w else None, ut_ref[...], q_ref[...],
        k_ref[...], p_ref[...], gcl_ref[...], g_ref[...] if has_g else None, do_ref[...])
    dut_ref[...] = du.astype(dut_ref.dtype)
    if has_w:
        dw_ref[...] = dw.astype(dw_ref.dtype)
    dqg_ref[...] = dqg.astype(dqg_ref.dtype)
    dkd_ref[...] = dkd.astype(dkd_ref.dtype)
    dp_ref[...] = dp.astype(dp_ref.dtype)
    dgcl_ref[...] = dgcl
    ds_scr[...] = ds

    @pl.when(i == pl.num_programs(1) - 1)
    def _():
        ds0_ref[...] = ds


def _backward_tpu(w, ut, q, k, p, gcl, gam, h, do, dst, cfg: Config):
    """The TPU backward: one Pallas call, grid (B*H, chunks visited last to first), the
    whole value dim per program. Returns (dw | None, dut, dqg, dkd, dp, dgcl, ds0) with
    dqg, dkd chunk-major (B*H, Tp, K), before the decay chain (_chain_decay)."""
    b, tp, nh, kdim = q.shape
    bh = b * nh
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    has_w, has_g = w is not None, gam is not None
    f32 = jnp.float32
    out_shapes = [jax.ShapeDtypeStruct((bh, tp, vdim), f32)]
    if has_w:
        out_shapes.append(jax.ShapeDtypeStruct((bh, tp, kdim), f32))
    out_shapes += [jax.ShapeDtypeStruct((bh, tp, kdim), f32),
                   jax.ShapeDtypeStruct((bh, tp, kdim), f32),
                   jax.ShapeDtypeStruct((bh, tp, c), f32),
                   jax.ShapeDtypeStruct((bh, n, 1, 1), f32),
                   jax.ShapeDtypeStruct((bh, kdim, vdim), f32)]
    qx, kx, gx = _layout(q, k, gam, cfg)
    args = (([w] if has_w else []) + [ut, qx, kx, p, gcl] + ([gx] if has_g else [])
            + [h, do, dst])
    rev = lambda j: n - 1 - j  # noqa: E731  (chunks visited last to first)
    vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, rev(j), 0))
    sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
    in_specs = _tpu_in_specs(has_w, has_g, kdim, vdim, c, rev) + [
        pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, rev(j), 0, 0)),
        vspec, sspec]
    kpart = pl.BlockSpec((None, c, kdim), lambda i, j: (i, rev(j), 0))
    out_specs = [vspec] + ([kpart] if has_w else []) + [
        kpart, kpart,
        pl.BlockSpec((None, c, c), lambda i, j: (i, rev(j), 0)),
        pl.BlockSpec((None, None, 1, 1), lambda i, j: (i, rev(j), 0, 0)),
        sspec]
    kernel = functools.partial(_bwd_kernel_tpu, has_w=has_w, has_g=has_g)
    outs = pl.pallas_call(
        kernel, grid=(bh, n), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shapes,
        scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
        interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
        name="linear_chunk_bwd")(*args)
    dut, *outs = outs
    dw = outs.pop(0) if has_w else None
    dqg, dkd, dp, dgcl, ds0 = outs
    return dw, dut, dqg, dkd, dp, dgcl, ds0


def _chain_decay(dqg, dkd, dgcl, q, k, gcl, gam, chunk):
    """From the kernel's gradients w.r.t. Qg = Q exp(G), Kd = K exp(G_C - G) (chunk-major
    float32) to those w.r.t. q, k (B, Tp, H, K), G (B, Tp, H) and G_C (added to dgcl):
    elementwise XLA, fused with the layout change back to the inputs' (B, Tp, H, K)."""
    b, tp, h, _ = q.shape
    back = lambda x: common.from_chunk_major(x, b, h)  # noqa: E731
    if gam is None:
        return back(dqg), back(dkd), None, dgcl
    n = tp // chunk
    g = jnp.transpose(gam, (0, 2, 1)).reshape(b * h, n, chunk)
    e_q = jnp.exp(g).reshape(b * h, tp, 1)
    e_k = jnp.exp(gcl.reshape(b * h, n, 1) - g).reshape(b * h, tp, 1)
    dq, dk = dqg * e_q, dkd * e_k                               # chunk-major
    f32 = jnp.float32
    # d/dG of Qg is Qg, of Kd is -Kd; d/dG_C of Kd is Kd
    tq = jnp.sum(dq * common.to_chunk_major(q.astype(f32), b, h), axis=-1)
    tk = jnp.sum(dk * common.to_chunk_major(k.astype(f32), b, h), axis=-1)
    dgam = jnp.transpose((tq - tk).reshape(b, h, tp), (0, 2, 1))
    dgcl = dgcl + jnp.sum(tk.reshape(b * h, n, chunk), axis=-1).reshape(gcl.shape)
    return back(dq), back(dk), dgam, dgcl


# ----------------------------------------------------------------------------- custom VJP

@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def chunk_recurrence(w, ut, q, k, p, gcl, gam, s0, cfg: Config):
    """(O (B, Tp, H, V) in cfg.out_dtype, final state (BH, K, V) float32).

    w: (BH, Tp, K) or None; ut: (BH, Tp, V); q, k: (B, Tp, H, K), the op's (padded)
    inputs; p: (BH, Tp, C); gcl: (BH, N, 1, 1) float32; gam: (B, Tp, H) float32, the
    in-chunk inclusive cumsum G of the log-decays, or None for no decay (then gcl must be
    0); s0: (BH, K, V) float32. w, ut, q, k, p share one dtype. BH = B * H, batch-major.
    """
    o, st = _forward(w, ut, q, k, p, gcl, gam, s0, cfg, save=False)
    return o, st


def _vjp_fwd(w, ut, q, k, p, gcl, gam, s0, cfg):
    """Residuals (w, ut, q, k, p, gcl, gam, h, u): u = U when the forward wrote it (the
    split GPU forward of GDN), and then ut (no longer needed) is None."""
    o, st, h, u = _forward(w, ut, q, k, p, gcl, gam, s0, cfg, save=True)
    return (o, st), (w, None if u is not None else ut, q, k, p, gcl, gam, h, u)


def _vjp_bwd(cfg, res, cts):
    w, ut, q, k, p, gcl, gam, h, u = res
    do, dst = cts
    dst = dst.astype(jnp.float32)
    if cfg.variant == "gpu":
        dw, dut, dq, dk, dp, dgcl, dgam, ds0 = _backward_gpu(
            w, ut, q, k, p, gcl, gam, h, do, dst, cfg, u=u)
    else:
        do = common.to_chunk_major(do, q.shape[0], q.shape[2])
        dw, dut, dqg, dkd, dp, dgcl, ds0 = _backward_tpu(
            w, ut, q, k, p, gcl, gam, h, do, dst, cfg)
        dq, dk, dgam, dgcl = _chain_decay(dqg, dkd, dgcl, q, k, gcl, gam, cfg.chunk)
    cast = lambda g, like: None if like is None else g.astype(like.dtype)  # noqa: E731
    # dut in the inputs' dtype (ut may be None here: the split forward saved U instead)
    return (cast(dw, w), cast(dut, p), cast(dq, q), cast(dk, k), cast(dp, p), dgcl, dgam,
            ds0)


chunk_recurrence.defvjp(_vjp_fwd, _vjp_bwd)


def block_v(kdim: int, vdim: int, variant: str, programs: int = 1 << 30,
            force: int | None = None) -> int:
    """Value columns per GPU program. The state slice (K x BV float32) stays in registers;
    the sequential loop runs one program per (batch*head, value block), so with few heads
    the value dim is split further to keep more of the chip's 132 SMs busy."""
    if variant != "gpu":
        return vdim
    if force is not None:
        return min(force, vdim)
    bv = min(64 if kdim <= 128 else 32, vdim)
    while bv > MIN_BLOCK_V and programs * (vdim // bv) < SEQ_PROGRAMS:
        bv //= 2
    return bv
