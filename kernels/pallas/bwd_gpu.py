"""The recurrence's backward on the GPU (Triton), as two calls.

1. A sequential dS pass per (batch, head, value block), last chunk to first: carries
   dS = dL/dS' and writes per chunk dU = P^T dO + Kd dS' and dS' itself (4 matmuls a
   chunk: only this needs the recurrence, and nothing K-sided is summed over value
   blocks afterwards).
2. A pass parallel over (batch, head, chunk), all value columns per program: from the
   saved chunk-start state S, dS' and dU (U = Ut - W S recomputed, or read where the
   forward saved it),

       dQg = dO S^T   dKd = U dS'^T   dW = -dU S^T   dP = dO U^T   dG_C = e^G_C <S, dS'>

   then the decay chain in place: dq = dQg e^G, dk = dKd e^(G_C - G),
   dG = <dq, q> - <dk, k>, dG_C += sum_t <dk, k>.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common, tiles
from kernels.pallas.plan import Config, dims, sequential_params

GRADS_STAGES = 1  # the gradient kernel reads each tile once: nothing to pipeline


def _dstate_kernel(*refs, has_w, has_g, has_key, chunk, num_chunks, pieces):
    (w_ref, _, q_ref, k_ref, p_ref, gcl_ref, g_ref, key_ref), rest = tiles.split_refs(
        refs, has_w, has_g, has_key)
    do_ref, dst_ref = rest[:2]
    bounds_ref = rest[2] if pieces > 1 else None
    du_ref, dh_ref, ds0_ref = rest[-3:]
    dt = du_ref.dtype
    prec = common.dot_precision(dt)

    def step(n, ds):
        rows = pl.ds(n * chunk, chunk)
        gam = g_ref[rows][:, None] if has_g else None
        gkey = key_ref[rows][:, None] if has_key else None
        return rows, tiles.dstate_step(ds, w_ref[rows, :] if has_w else None,
                                       q_ref[rows, :], k_ref[rows, :], p_ref[rows, :],
                                       gam, gcl_ref[n], do_ref[rows, :].astype(dt), prec,
                                       gkey)

    def body_from(top):
        def body(i, ds):
            n = top - i
            rows, (dsc, du, ds) = step(n, ds)
            dh_ref[n] = dsc
            du_ref[rows, :] = du
            return ds
        return body

    if pieces == 1:
        ds0_ref[...] = lax.fori_loop(0, num_chunks, body_from(num_chunks - 1),
                                     dst_ref[...])
        return
    # This program's piece, last chunk first (documents.piece_bounds): the last piece
    # starts from the final state's cotangent, the others from zero at a chunk holding
    # a document start, whose own dS' and dU the next piece writes.
    lo, last, hi = common.piece_walk(bounds_ref, pieces, reverse=True)
    dst = dst_ref[...]
    start = jnp.where(pl.program_id(3) == pieces - 1, dst, jnp.zeros_like(dst))
    ds = lax.fori_loop(0, hi - last, lambda i, ds: step(hi - i, ds)[1][2], start)
    ds = lax.fori_loop(0, last - lo + 1, body_from(last), ds)

    @pl.when((lo == 0) & (last >= 0))
    def _store_initial():
        ds0_ref[...] = ds


def _grads_kernel(*refs, has_w, has_g, has_key, u_saved, block_cols):
    """u_saved: the ut slot holds U itself (written by the forward), so neither W nor a
    matmul is needed for it. has_key: the key weights come as their own input gkey, and
    its gradient <dk, k> is its own output (not folded into dG and dG_C)."""
    (w_ref, ut_ref, q_ref, k_ref, _, gcl_ref, g_ref, key_ref), rest = tiles.split_refs(
        refs, has_w, has_g, has_key)
    h_ref, dh_ref, do_ref, du_ref, dq_ref, dk_ref, *rest = rest
    dw_ref = rest.pop(0) if has_w else None
    dp_ref, dgcl_ref, *rest = rest
    dg_ref = rest.pop(0) if has_g else None
    dkey_ref = rest[0] if has_key else None
    f32 = jnp.float32
    mm = tiles.mm
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
        uc = (ut_ref[:, cols] if u_saved
              else tiles.chunk_values(ut_ref[:, cols], w, sc, prec))
        dqg += mm(doc, sc, tb=True, precision=prec)
        dp += mm(doc, uc, tb=True, precision=prec)
        dkd += mm(uc, dsc, tb=True, precision=prec)
        if has_w:
            dw -= mm(du_ref[:, cols], sc, tb=True, precision=prec)
        sds += jnp.sum(jnp.sum(sc.astype(f32) * dsc.astype(f32), axis=1, keepdims=True),
                       axis=0, keepdims=True)
    gcl = gcl_ref[...]
    dgcl = jnp.exp(gcl) * sds
    if has_key:
        dq = dqg * jnp.exp(g_ref[...][:, None])
        dk = dkd * jnp.exp(key_ref[...][:, None])
        dg_ref[...] = jnp.sum(dq * q_ref[...].astype(f32), axis=1)
        dkey_ref[...] = jnp.sum(dk * k_ref[...].astype(f32), axis=1)
    elif has_g:
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


def backward(w, ut, q, k, p, gcl, gam, gkey, h, do, dst, bounds, cfg: Config, u=None):
    """The GPU backward. u: U = Ut - W S as the forward wrote it (then ut may be None),
    else recomputed from ut, w and the states h. Returns
    (dw | None, dut, dq, dk, dp, dgcl, dgam | None, dgkey | None, ds0) with dq, dk as
    (B, Tp, H, K) in the input dtype and the decay chain applied."""
    u_saved = u is not None
    ut = u if u_saved else ut
    c, bv = cfg.chunk, cfg.block_v
    b, tp, nh, kdim, vdim, n, has_w, has_g = dims(w, ut, q, gam, c)
    has_key = gkey is not None
    bh = b * nh
    dt = ut.dtype
    lead = ([w] if has_w else []) + [ut, q, k, p, gcl] + ([gam] if has_g else []) + (
        [gkey] if has_key else [])

    seq = common.sequence_specs(nh, tp, n)
    grid, bounds_specs, bounds_args = common.sequential_grid(b, nh, vdim // bv, bounds,
                                                             cfg.pieces)
    du, dh, ds0 = pl.pallas_call(
        functools.partial(_dstate_kernel, has_w=has_w, has_g=has_g, has_key=has_key,
                          chunk=c, num_chunks=n, pieces=cfg.pieces),
        grid=grid,
        in_specs=(common.recurrence_in_specs(seq, has_w, has_g, kdim, bv, c,
                                             has_key=has_key)
                  + [seq.token_block(bv), seq.state(kdim, bv)] + bounds_specs),
        out_specs=[seq.rows_block(bv), seq.states(kdim, bv), seq.state(kdim, bv)],
        out_shape=[jax.ShapeDtypeStruct((bh, tp, vdim), dt),
                   jax.ShapeDtypeStruct((bh, n, kdim, vdim), dt),
                   jax.ShapeDtypeStruct((bh, kdim, vdim), jnp.float32)],
        interpret=common.interpret(),
        compiler_params=sequential_params(kdim, bv, cfg.tuning),
        name="linear_chunk_bwd_dstate")(*lead, do, dst, *bounds_args)

    spec = common.chunk_specs(nh, c)
    crow, tok, one, gspec = spec.rows, spec.token(kdim), spec.scalar, spec.per_token
    state = spec.state(kdim, vdim)
    per_token = int(has_g) + int(has_key)
    in_specs = (([crow(kdim)] if has_w else []) + [crow(vdim), tok, tok, crow(c), one]
                + [gspec] * per_token + [state, state, spec.token(vdim), crow(vdim)])
    out_specs = [tok, tok] + ([crow(kdim)] if has_w else []) + [crow(c), one] + (
        [gspec] * per_token)
    out_shape = ([jax.ShapeDtypeStruct(q.shape, q.dtype)] * 2
                 + ([jax.ShapeDtypeStruct((bh, tp, kdim), dt)] if has_w else [])
                 + [jax.ShapeDtypeStruct((bh, tp, c), dt),
                    jax.ShapeDtypeStruct((bh, n, 1, 1), jnp.float32)]
                 + [jax.ShapeDtypeStruct((b, tp, nh), jnp.float32)] * per_token)
    outs = pl.pallas_call(
        functools.partial(_grads_kernel, has_w=has_w, has_g=has_g, has_key=has_key,
                          u_saved=u_saved, block_cols=min(vdim, 64)),
        grid=(b, nh, n), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        interpret=common.interpret(),
        compiler_params=common.compiler_params("gpu", num_warps=cfg.tuning.grads_warps,
                                               num_stages=GRADS_STAGES),
        name="linear_chunk_bwd_grads")(*lead, h, dh, do, du)
    dq, dk, *outs = outs
    dw = outs.pop(0) if has_w else None
    dp, dgcl, *outs = outs
    dgam = outs.pop(0) if has_g else None
    dgkey = outs[0] if has_key else None
    return dw, du, dq, dk, dp, dgcl, dgam, dgkey, ds0
