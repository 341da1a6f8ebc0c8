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

Backward (a reverse loop carrying dS = dL/dS', recomputing U from the saved chunk-start
state, so nothing per token is stored):

    dU  = P^T dO + Kd dS'          dS  = exp(G_C) dS' + Qg^T dO - W^T dU
    dUt = dU    dW = -dU S^T    dQg = dO S^T    dP = dO U^T    dKd = U dS'^T
    dG_C = exp(G_C) <S, dS'>

then, outside the kernel (elementwise XLA, _chain_decay): dq = dQg exp(G),
dk = dKd exp(G_C - G), dG = <dQg, Qg> - <dKd, Kd>, dG_C += sum_t <dKd, Kd>.
Saved for the backward pass: the chunk-start states, (T / C) K V floats per head.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common


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

def _decayed(q, k, gam, gcl):
    """Qg = Q * exp(G), Kd = K * exp(G_C - G) in the input dtype, formed here from the
    loaded q, k tiles and the float32 in-chunk cumulative log-decay G (a (C, 1) column),
    rather than read from a preparation pass. gam None: no decay, Qg = Q, Kd = K."""
    if gam is None:
        return q, k
    f32 = jnp.float32
    qg = (q.astype(f32) * jnp.exp(gam)).astype(q.dtype)
    kd = (k.astype(f32) * jnp.exp(gcl - gam)).astype(k.dtype)
    return qg, kd


def _chunk_values(ut, w, sc, prec):
    """The values a chunk writes, U = Ut - W S (U = Ut for linear attention), in the input
    dtype; the backward recomputes them from the saved chunk-start state."""
    u = ut.astype(jnp.float32)
    if w is not None:
        u = u - _mm(w, sc, precision=prec)
    return u.astype(ut.dtype)


def _fwd_chunk(s, w, ut, q, k, p, gcl, gam):
    """One chunk of the forward recurrence; s float32 (K, BV). Returns (o, s_next)."""
    dt = ut.dtype
    prec = common.dot_precision(dt)
    qg, kd = _decayed(q, k, gam, gcl)
    sc = s.astype(dt)
    uc = _chunk_values(ut, w, sc, prec)
    o = _mm(qg, sc, precision=prec) + _mm(p, uc, precision=prec)
    s_next = jnp.exp(gcl) * s + _mm(kd, uc, ta=True, precision=prec)
    return o, s_next


def _bwd_chunk(s, ds, w, ut, q, k, p, gcl, gam, do):
    """Vector-Jacobian product of one chunk. s: chunk-start state, ds: dL/d(next state).
    Returns (ds_prev, dut, dw, dqg, dkd, dp, dgcl); dqg, dkd are w.r.t. Qg, Kd (the exp
    factors are applied outside, in _chain_decay)."""
    dt = ut.dtype
    prec = common.dot_precision(dt)
    qg, kd = _decayed(q, k, gam, gcl)
    sc = s.astype(dt)
    dsc = ds.astype(dt)
    doc = do.astype(dt)
    uc = _chunk_values(ut, w, sc, prec)
    gc = jnp.exp(gcl)
    du = _mm(p, doc, ta=True, precision=prec) + _mm(kd, dsc, precision=prec)
    duc = du.astype(dt)
    ds_prev = gc * ds + _mm(qg, doc, ta=True, precision=prec)
    dw = None
    if w is not None:
        ds_prev = ds_prev - _mm(w, duc, ta=True, precision=prec)
        dw = -_mm(duc, sc, tb=True, precision=prec)
    dqg = _mm(doc, sc, tb=True, precision=prec)
    dp = _mm(doc, uc, tb=True, precision=prec)
    dkd = _mm(uc, dsc, tb=True, precision=prec)
    dgcl = gc * jnp.sum(jnp.sum(s * ds, axis=1, keepdims=True), axis=0, keepdims=True)
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
            h_ref[n] = s
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
        h_ref[...] = s
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
    out_shapes = [jax.ShapeDtypeStruct((bh, tp, vdim), jnp.dtype(cfg.out_dtype)),
                  jax.ShapeDtypeStruct((bh, kdim, vdim), jnp.float32)]
    if save:
        out_shapes.append(jax.ShapeDtypeStruct((bh, n, kdim, vdim), jnp.float32))
    qx, kx, gx = _layout(q, k, gam, cfg)
    args = ([w] if has_w else []) + [ut, qx, kx, p, gcl] + ([gx] if has_g else []) + [s0]

    if cfg.variant == "gpu":
        bv = cfg.block_v
        row = lambda bi, hi: bi * h + hi  # noqa: E731
        vspec = pl.BlockSpec((None, tp, bv), lambda bi, hi, j: (row(bi, hi), 0, j))
        sspec = pl.BlockSpec((None, kdim, bv), lambda bi, hi, j: (row(bi, hi), 0, j))
        in_specs = _gpu_in_specs(has_w, has_g, h, tp, kdim, bv, c, n) + [sspec]
        out_specs = [vspec, sspec]
        if save:
            out_specs.append(pl.BlockSpec((None, n, kdim, bv),
                                          lambda bi, hi, j: (row(bi, hi), 0, 0, j)))
        kernel = functools.partial(_fwd_kernel_gpu, has_w=has_w, has_g=has_g, save=save,
                                   chunk=c, num_chunks=n)
        return pl.pallas_call(
            kernel, grid=(b, h, vdim // bv), in_specs=in_specs, out_specs=out_specs,
            out_shape=out_shapes, interpret=common.interpret(),
            compiler_params=common.compiler_params("gpu", num_warps=4 if kdim * bv <= 8192
                                                   else 8, num_stages=2),
            name="linear_chunk_fwd")(*args)

    vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, j, 0))
    sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
    in_specs = _tpu_in_specs(has_w, has_g, kdim, vdim, c, lambda j: j) + [sspec]
    out_specs = [vspec, sspec]
    if save:
        out_specs.append(pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, j, 0, 0)))
    kernel = functools.partial(_fwd_kernel_tpu, has_w=has_w, has_g=has_g, save=save)
    return pl.pallas_call(
        kernel, grid=(bh, n), in_specs=in_specs, out_specs=out_specs, out_shape=out_shapes,
        scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
        interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
        name="linear_chunk_fwd")(*args)


# ----------------------------------------------------------------------------- backward kernels

def _bwd_kernel_gpu(*refs, has_w, has_g, chunk, num_chunks):
    (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref), rest = _split(refs, has_w, has_g)
    h_ref, do_ref, dst_ref, dut_ref, *rest = rest
    if has_w:
        dw_ref, *rest = rest
    dqg_ref, dkd_ref, dp_ref, dgcl_ref, ds0_ref = rest

    def body(i, ds):
        n = num_chunks - 1 - i
        rows = pl.ds(n * chunk, chunk)
        w = w_ref[rows, :] if has_w else None
        gam = g_ref[rows][:, None] if has_g else None
        ds, du, dw, dqg, dkd, dp, dgcl = _bwd_chunk(
            h_ref[n], ds, w, ut_ref[rows, :], q_ref[rows, :], k_ref[rows, :],
            p_ref[rows, :], gcl_ref[n], gam, do_ref[rows, :])
        dut_ref[rows, :] = du.astype(dut_ref.dtype)
        if has_w:
            dw_ref[rows, :] = dw.astype(dw_ref.dtype)
        dqg_ref[rows, :] = dqg.astype(dqg_ref.dtype)
        dkd_ref[rows, :] = dkd.astype(dkd_ref.dtype)
        dp_ref[rows, :] = dp.astype(dp_ref.dtype)
        dgcl_ref[n] = dgcl
        return ds

    ds0_ref[...] = lax.fori_loop(0, num_chunks, body, dst_ref[...])


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


def _backward(w, ut, q, k, p, gcl, gam, h, do, dst, cfg: Config):
    """Returns (dw | None, dut, dqg, dkd, dp, dgcl, ds0), dqg/dkd chunk-major (B*H, Tp, K);
    the K-side gradients are summed over value blocks here (each program sees only its
    block of columns)."""
    b, tp, nh, kdim = q.shape
    bh = b * nh
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    has_w, has_g = w is not None, gam is not None
    bv = cfg.block_v if cfg.variant == "gpu" else vdim
    nv = vdim // bv
    f32 = jnp.float32
    out_shapes = [jax.ShapeDtypeStruct((bh, tp, vdim), f32)]
    if has_w:
        out_shapes.append(jax.ShapeDtypeStruct((nv, bh, tp, kdim), f32))
    out_shapes += [jax.ShapeDtypeStruct((nv, bh, tp, kdim), f32),
                   jax.ShapeDtypeStruct((nv, bh, tp, kdim), f32),
                   jax.ShapeDtypeStruct((nv, bh, tp, c), f32),
                   jax.ShapeDtypeStruct((nv, bh, n, 1, 1), f32),
                   jax.ShapeDtypeStruct((bh, kdim, vdim), f32)]
    qx, kx, gx = _layout(q, k, gam, cfg)
    args = (([w] if has_w else []) + [ut, qx, kx, p, gcl] + ([gx] if has_g else [])
            + [h, do, dst])

    if cfg.variant == "gpu":
        row = lambda bi, hi: bi * nh + hi  # noqa: E731
        vspec = pl.BlockSpec((None, tp, bv), lambda bi, hi, j: (row(bi, hi), 0, j))
        sspec = pl.BlockSpec((None, kdim, bv), lambda bi, hi, j: (row(bi, hi), 0, j))
        in_specs = _gpu_in_specs(has_w, has_g, nh, tp, kdim, bv, c, n) + [
            pl.BlockSpec((None, n, kdim, bv), lambda bi, hi, j: (row(bi, hi), 0, 0, j)),
            vspec, sspec]
        kpart = pl.BlockSpec((None, None, tp, kdim),
                             lambda bi, hi, j: (j, row(bi, hi), 0, 0))
        out_specs = [vspec] + ([kpart] if has_w else []) + [
            kpart, kpart,
            pl.BlockSpec((None, None, tp, c), lambda bi, hi, j: (j, row(bi, hi), 0, 0)),
            pl.BlockSpec((None, None, n, 1, 1), lambda bi, hi, j: (j, row(bi, hi), 0, 0, 0)),
            sspec]
        kernel = functools.partial(_bwd_kernel_gpu, has_w=has_w, has_g=has_g, chunk=c,
                                   num_chunks=n)
        outs = pl.pallas_call(
            kernel, grid=(b, nh, nv), in_specs=in_specs, out_specs=out_specs,
            out_shape=out_shapes, interpret=common.interpret(),
            compiler_params=common.compiler_params("gpu", num_warps=4 if kdim * bv <= 8192
                                                   else 8, num_stages=2),
            name="linear_chunk_bwd")(*args)
    else:
        rev = lambda j: n - 1 - j  # noqa: E731  (chunks visited last to first)
        vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, rev(j), 0))
        sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
        in_specs = _tpu_in_specs(has_w, has_g, kdim, vdim, c, rev) + [
            pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, rev(j), 0, 0)),
            vspec, sspec]
        kpart = pl.BlockSpec((None, None, c, kdim), lambda i, j: (0, i, rev(j), 0))
        out_specs = [vspec] + ([kpart] if has_w else []) + [
            kpart, kpart,
            pl.BlockSpec((None, None, c, c), lambda i, j: (0, i, rev(j), 0)),
            pl.BlockSpec((None, None, None, 1, 1), lambda i, j: (0, i, rev(j), 0, 0)),
            sspec]
        kernel = functools.partial(_bwd_kernel_tpu, has_w=has_w, has_g=has_g)
        outs = pl.pallas_call(
            kernel, grid=(bh, n), in_specs=in_specs, out_specs=out_specs,
            out_shape=out_shapes,
            scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
            interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
            name="linear_chunk_bwd")(*args)

    dut, *outs = outs
    dw = None
    if has_w:
        dw, *outs = outs
        dw = jnp.sum(dw, axis=0)
    dqg, dkd, dp, dgcl, ds0 = outs
    return dw, dut, jnp.sum(dqg, 0), jnp.sum(dkd, 0), jnp.sum(dp, 0), jnp.sum(dgcl, 0), ds0


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
    """(O (BH, Tp, V) in cfg.out_dtype, final state (BH, K, V) float32).

    w: (BH, Tp, K) or None; ut: (BH, Tp, V); q, k: (B, Tp, H, K), the op's (padded)
    inputs; p: (BH, Tp, C); gcl: (BH, N, 1, 1) float32; gam: (B, Tp, H) float32, the
    in-chunk inclusive cumsum G of the log-decays, or None for no decay (then gcl must be
    0); s0: (BH, K, V) float32. w, ut, q, k, p share one dtype. BH = B * H, batch-major.
    """
    o, st = _forward(w, ut, q, k, p, gcl, gam, s0, cfg, save=False)
    return o, st


def _vjp_fwd(w, ut, q, k, p, gcl, gam, s0, cfg):
    o, st, h = _forward(w, ut, q, k, p, gcl, gam, s0, cfg, save=True)
    return (o, st), (w, ut, q, k, p, gcl, gam, h)


def _vjp_bwd(cfg, res, cts):
    w, ut, q, k, p, gcl, gam, h = res
    do, dst = cts
    dw, dut, dqg, dkd, dp, dgcl, ds0 = _backward(w, ut, q, k, p, gcl, gam, h, do,
                                                  dst.astype(jnp.float32), cfg)
    dq, dk, dgam, dgcl = _chain_decay(dqg, dkd, dgcl, q, k, gcl, gam, cfg.chunk)
    cast = lambda g, like: None if like is None else g.astype(like.dtype)  # noqa: E731
    return (cast(dw, w), cast(dut, ut), cast(dq, q), cast(dk, k), cast(dp, p), dgcl, dgam,
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
    while bv > 32 and programs * (vdim // bv) < 128:
        bv //= 2
    return bv
