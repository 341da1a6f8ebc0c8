"""The sequential part of every chunkwise linear op, as Pallas kernels with a custom VJP.

Per chunk n (C tokens; S is the (K, V) float32 state before the chunk) the forward is

    U   = Ut - W S                 (W = 0 for linear attention: U = V)
    O   = Qg S + P U               (Qg = Q * gamma, P = (Q K^T) * decay mask)
    S'  = exp(gcl) S + Kd^T U      (Kd = K * exp(G_C - G), gcl = G_C)

where Ut, W, Qg, P, Kd, gcl come from a parallel-over-chunks preparation (kernels.pallas.gdn,
kernels.pallas.linear). Only this loop over chunks is sequential, so only it must be a
kernel: the state never leaves registers (GPU) or VMEM (TPU) while the chunks go by.

Backward (a reverse loop carrying dS = dL/dS', recomputing U from the saved chunk-start
state, so nothing per token is stored):

    dU  = P^T dO + Kd dS'          dS  = exp(gcl) dS' + Qg^T dO - W^T dU
    dUt = dU    dW = -dU S^T    dQg = dO S^T    dP = dO U^T    dKd = U dS'^T
    dgcl = exp(gcl) <S, dS'>

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

def _chunk_values(ut, w, sc, prec):
    """The values a chunk writes, U = Ut - W S (U = Ut for linear attention), in the input
    dtype; the backward recomputes them from the saved chunk-start state."""
    u = ut.astype(jnp.float32)
    if w is not None:
        u = u - _mm(w, sc, precision=prec)
    return u.astype(ut.dtype)


def _fwd_chunk(s, w, ut, qg, kd, p, gcl):
    """One chunk of the forward recurrence; s float32 (K, BV). Returns (o, s_next)."""
    dt = ut.dtype
    prec = common.dot_precision(dt)
    sc = s.astype(dt)
    uc = _chunk_values(ut, w, sc, prec)
    o = _mm(qg, sc, precision=prec) + _mm(p, uc, precision=prec)
    s_next = jnp.exp(gcl) * s + _mm(kd, uc, ta=True, precision=prec)
    return o, s_next


def _bwd_chunk(s, ds, w, ut, qg, kd, p, gcl, do):
    """Vector-Jacobian product of one chunk. s: chunk-start state, ds: dL/d(next state).
    Returns (ds_prev, dut, dw, dqg, dkd, dp, dgcl)."""
    dt = ut.dtype
    prec = common.dot_precision(dt)
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


# ----------------------------------------------------------------------------- forward kernels

def _fwd_kernel_gpu(*refs, has_w, save, chunk, num_chunks):
    if has_w:
        w_ref, *refs = refs
    ut_ref, qg_ref, kd_ref, p_ref, gcl_ref, s0_ref, o_ref, st_ref, *rest = refs
    h_ref = rest[0] if save else None

    def body(n, s):
        rows = pl.ds(n * chunk, chunk)
        if save:
            h_ref[n] = s
        w = w_ref[rows, :] if has_w else None
        o, s = _fwd_chunk(s, w, ut_ref[rows, :], qg_ref[rows, :], kd_ref[rows, :],
                          p_ref[rows, :], gcl_ref[n])
        o_ref[rows, :] = o.astype(o_ref.dtype)
        return s

    st_ref[...] = lax.fori_loop(0, num_chunks, body, s0_ref[...])


def _fwd_kernel_tpu(*refs, has_w, save):
    if has_w:
        w_ref, *refs = refs
    ut_ref, qg_ref, kd_ref, p_ref, gcl_ref, s0_ref, o_ref, st_ref, *rest = refs
    h_ref, s_scr = (rest[0], rest[1]) if save else (None, rest[0])
    n = pl.program_id(1)

    @pl.when(n == 0)
    def _():
        s_scr[...] = s0_ref[...]

    s = s_scr[...]
    if save:
        h_ref[...] = s
    o, s = _fwd_chunk(s, w_ref[...] if has_w else None, ut_ref[...], qg_ref[...],
                      kd_ref[...], p_ref[...], gcl_ref[...])
    o_ref[...] = o.astype(o_ref.dtype)
    s_scr[...] = s

    @pl.when(n == pl.num_programs(1) - 1)
    def _():
        st_ref[...] = s


def _forward(w, ut, qg, kd, p, gcl, s0, cfg: Config, save: bool):
    bh, tp, kdim = qg.shape
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    has_w = w is not None
    out_shapes = [jax.ShapeDtypeStruct((bh, tp, vdim), jnp.dtype(cfg.out_dtype)),
                  jax.ShapeDtypeStruct((bh, kdim, vdim), jnp.float32)]
    if save:
        out_shapes.append(jax.ShapeDtypeStruct((bh, n, kdim, vdim), jnp.float32))
    args = ([w] if has_w else []) + [ut, qg, kd, p, gcl, s0]

    if cfg.variant == "gpu":
        bv = cfg.block_v
        kspec = pl.BlockSpec((None, tp, kdim), lambda i, j: (i, 0, 0))
        vspec = pl.BlockSpec((None, tp, bv), lambda i, j: (i, 0, j))
        sspec = pl.BlockSpec((None, kdim, bv), lambda i, j: (i, 0, j))
        in_specs = ([kspec] if has_w else []) + [
            vspec, kspec, kspec, pl.BlockSpec((None, tp, c), lambda i, j: (i, 0, 0)),
            pl.BlockSpec((None, n, 1, 1), lambda i, j: (i, 0, 0, 0)), sspec]
        out_specs = [vspec, sspec]
        if save:
            out_specs.append(pl.BlockSpec((None, n, kdim, bv), lambda i, j: (i, 0, 0, j)))
        kernel = functools.partial(_fwd_kernel_gpu, has_w=has_w, save=save, chunk=c,
                                   num_chunks=n)
        return pl.pallas_call(
            kernel, grid=(bh, vdim // bv), in_specs=in_specs, out_specs=out_specs,
            out_shape=out_shapes, interpret=common.interpret(),
            compiler_params=common.compiler_params("gpu", num_warps=4 if kdim * bv <= 8192
                                                   else 8, num_stages=2),
            name="linear_chunk_fwd")(*args)

    kspec = pl.BlockSpec((None, c, kdim), lambda i, j: (i, j, 0))
    vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, j, 0))
    sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
    in_specs = ([kspec] if has_w else []) + [
        vspec, kspec, kspec, pl.BlockSpec((None, c, c), lambda i, j: (i, j, 0)),
        pl.BlockSpec((None, None, 1, 1), lambda i, j: (i, j, 0, 0)), sspec]
    out_specs = [vspec, sspec]
    if save:
        out_specs.append(pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, j, 0, 0)))
    kernel = functools.partial(_fwd_kernel_tpu, has_w=has_w, save=save)
    return pl.pallas_call(
        kernel, grid=(bh, n), in_specs=in_specs, out_specs=out_specs, out_shape=out_shapes,
        scratch_shapes=[common.pltpu.VMEM((kdim, vdim), jnp.float32)],
        interpret=common.interpret(), compiler_params=common.compiler_params("tpu"),
        name="linear_chunk_fwd")(*args)


# ----------------------------------------------------------------------------- backward kernels

def _bwd_kernel_gpu(*refs, has_w, chunk, num_chunks):
    if has_w:
        w_ref, *refs = refs
    (ut_ref, qg_ref, kd_ref, p_ref, gcl_ref, h_ref, do_ref, dst_ref,
     dut_ref, *refs) = refs
    if has_w:
        dw_ref, *refs = refs
    dqg_ref, dkd_ref, dp_ref, dgcl_ref, ds0_ref = refs

    def body(i, ds):
        n = num_chunks - 1 - i
        rows = pl.ds(n * chunk, chunk)
        w = w_ref[rows, :] if has_w else None
        ds, du, dw, dqg, dkd, dp, dgcl = _bwd_chunk(
            h_ref[n], ds, w, ut_ref[rows, :], qg_ref[rows, :], kd_ref[rows, :],
            p_ref[rows, :], gcl_ref[n], do_ref[rows, :])
        dut_ref[rows, :] = du.astype(dut_ref.dtype)
        if has_w:
            dw_ref[rows, :] = dw.astype(dw_ref.dtype)
        dqg_ref[rows, :] = dqg.astype(dqg_ref.dtype)
        dkd_ref[rows, :] = dkd.astype(dkd_ref.dtype)
        dp_ref[rows, :] = dp.astype(dp_ref.dtype)
        dgcl_ref[n] = dgcl
        return ds

    ds0_ref[...] = lax.fori_loop(0, num_chunks, body, dst_ref[...])


def _bwd_kernel_tpu(*refs, has_w):
    if has_w:
        w_ref, *refs = refs
    (ut_ref, qg_ref, kd_ref, p_ref, gcl_ref, h_ref, do_ref, dst_ref,
     dut_ref, *refs) = refs
    if has_w:
        dw_ref, *refs = refs
    dqg_ref, dkd_ref, dp_ref, dgcl_ref, ds0_ref, ds_scr = refs
    i = pl.program_id(1)

    @pl.when(i == 0)
    def _():
        ds_scr[...] = dst_ref[...]

    ds, du, dw, dqg, dkd, dp, dgcl = _bwd_chunk(
        h_ref[...], ds_scr[...], w_ref[...] if has_w else None, ut_ref[...], qg_ref[...],
        kd_ref[...], p_ref[...], gcl_ref[...], do_ref[...])
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


def _backward(w, ut, qg, kd, p, gcl, h, do, dst, cfg: Config):
    """Returns (dw | None, dut, dqg, dkd, dp, dgcl, ds0); the K-side gradients are summed
    over value blocks here (each program sees only its block of columns)."""
    bh, tp, kdim = qg.shape
    vdim = ut.shape[-1]
    c = cfg.chunk
    n = tp // c
    has_w = w is not None
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
    args = ([w] if has_w else []) + [ut, qg, kd, p, gcl, h, do, dst]

    if cfg.variant == "gpu":
        kspec = pl.BlockSpec((None, tp, kdim), lambda i, j: (i, 0, 0))
        vspec = pl.BlockSpec((None, tp, bv), lambda i, j: (i, 0, j))
        sspec = pl.BlockSpec((None, kdim, bv), lambda i, j: (i, 0, j))
        pspec = pl.BlockSpec((None, tp, c), lambda i, j: (i, 0, 0))
        gspec = pl.BlockSpec((None, n, 1, 1), lambda i, j: (i, 0, 0, 0))
        in_specs = ([kspec] if has_w else []) + [
            vspec, kspec, kspec, pspec, gspec,
            pl.BlockSpec((None, n, kdim, bv), lambda i, j: (i, 0, 0, j)), vspec, sspec]
        kpart = pl.BlockSpec((None, None, tp, kdim), lambda i, j: (j, i, 0, 0))
        out_specs = [vspec] + ([kpart] if has_w else []) + [
            kpart, kpart, pl.BlockSpec((None, None, tp, c), lambda i, j: (j, i, 0, 0)),
            pl.BlockSpec((None, None, n, 1, 1), lambda i, j: (j, i, 0, 0, 0)), sspec]
        kernel = functools.partial(_bwd_kernel_gpu, has_w=has_w, chunk=c, num_chunks=n)
        outs = pl.pallas_call(
            kernel, grid=(bh, nv), in_specs=in_specs, out_specs=out_specs,
            out_shape=out_shapes, interpret=common.interpret(),
            compiler_params=common.compiler_params("gpu", num_warps=4 if kdim * bv <= 8192
                                                   else 8, num_stages=2),
            name="linear_chunk_bwd")(*args)
    else:
        rev = lambda i, j: n - 1 - j  # noqa: E731  (chunks visited last to first)
        kspec = pl.BlockSpec((None, c, kdim), lambda i, j: (i, rev(i, j), 0))
        vspec = pl.BlockSpec((None, c, vdim), lambda i, j: (i, rev(i, j), 0))
        sspec = pl.BlockSpec((None, kdim, vdim), lambda i, j: (i, 0, 0))
        in_specs = ([kspec] if has_w else []) + [
            vspec, kspec, kspec,
            pl.BlockSpec((None, c, c), lambda i, j: (i, rev(i, j), 0)),
            pl.BlockSpec((None, None, 1, 1), lambda i, j: (i, rev(i, j), 0, 0)),
            pl.BlockSpec((None, None, kdim, vdim), lambda i, j: (i, rev(i, j), 0, 0)),
            vspec, sspec]
        kpart = pl.BlockSpec((None, None, c, kdim), lambda i, j: (0, i, rev(i, j), 0))
        out_specs = [vspec] + ([kpart] if has_w else []) + [
            kpart, kpart,
            pl.BlockSpec((None, None, c, c), lambda i, j: (0, i, rev(i, j), 0)),
            pl.BlockSpec((None, None, None, 1, 1), lambda i, j: (0, i, rev(i, j), 0, 0)),
            sspec]
        kernel = functools.partial(_bwd_kernel_tpu, has_w=has_w)
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


# ----------------------------------------------------------------------------- custom VJP

@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def chunk_recurrence(w, ut, qg, kd, p, gcl, s0, cfg: Config):
    """(O (BH, Tp, V) in cfg.out_dtype, final state (BH, K, V) float32).

    w: (BH, Tp, K) or None; ut: (BH, Tp, V); qg, kd: (BH, Tp, K); p: (BH, Tp, C);
    gcl: (BH, N, 1, 1) float32; s0: (BH, K, V) float32. All but gcl/s0 share one dtype.
    """
    o, st = _forward(w, ut, qg, kd, p, gcl, s0, cfg, save=False)
    return o, st


def _vjp_fwd(w, ut, qg, kd, p, gcl, s0, cfg):
    o, st, h = _forward(w, ut, qg, kd, p, gcl, s0, cfg, save=True)
    return (o, st), (w, ut, qg, kd, p, gcl, h)


def _vjp_bwd(cfg, res, cts):
    w, ut, qg, kd, p, gcl, h = res
    do, dst = cts
    dw, dut, dqg, dkd, dp, dgcl, ds0 = _backward(w, ut, qg, kd, p, gcl, h, do,
                                                  dst.astype(jnp.float32), cfg)
    cast = lambda g, like: None if like is None else g.astype(like.dtype)  # noqa: E731
    return (cast(dw, w), cast(dut, ut), cast(dqg, qg), cast(dkd, kd), cast(dp, p),
            dgcl, ds0)


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
