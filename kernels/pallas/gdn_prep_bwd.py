"""Backward of the gated delta rule's per-chunk preparation (kernels.pallas.gdn_prep) as one
Pallas (Triton) kernel: the vector-Jacobian product of

    A  = strict_lower(beta_t exp(G_t - G_s) k_t.k_s),   X = (I + A)^-1
    W  = X Rk,  Rk = diag(beta gamma) K   (gamma = exp(G))
    Ut = X Rv,  Rv = diag(beta) V
    P  = (Q K^T) * D,  D_ts = exp(G_t - G_s) (s <= t),   G_C = G_{C-1}

with the forward's saved float32 X, so no triangular solve. One program per
(batch, head, chunk), whole-chunk tiles (C x C and C x D dots, C, D powers of two >= 16),
float32 accumulation. Per chunk (all products float32-accumulated):

    dRk = X^T dW,  dRv = X^T dUt,  dX = dW Rk^T + dUt Rv^T
    dA  = -X^T dX X^T on the strict lower triangle (only there does A vary; X^T dX X^T
          there needs only dX's strict lower part, so dX's upper part is harmless)
    dKK = beta_t D_ts dA_ts           (A's dependence on K K^T)
    dQK = dP * D                      (P's dependence on Q K^T)
    dq  = dQK K
    dk  = (dKK + dKK^T) K + beta gamma dRk + dQK^T Q
    dv  = beta dRv
    dbeta_t = sum_s dA_ts D_ts KK_ts + gamma_t <dRk_t, k_t> + <dRv_t, v_t>
    dG  = rowsum(M) - colsum(M) + beta gamma <dRk, k>  (+ dG_C on the last row),
          M = beta_t dA_ts D_ts KK_ts + dP_ts P_ts   (d exp(G_t - G_s) = D (dG_t - dG_s))

dG is the cotangent of the in-chunk cumulative sum G; the caller (kernels.pallas.gdn)
turns it into that of the per-token log-decays by a reverse cumsum within each chunk.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common
from kernels.pallas.tiles import decay_mask, mm
from kernels.pallas.tuning import Tuning


def _prep_bwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, x_ref,
                     dw_ref, dut_ref, dp_ref, dgcl_ref, *refs, chunk, has_acc, packed):
    # packed: two more inputs, the masked log weight of the incoming state (W's gamma is
    # exp of it) and the run indices (D is 0 across runs) of packed documents.
    # has_acc: three more inputs, gradients of q, k and G from elsewhere (the recurrence),
    # added to this kernel's before the outputs are written (no separate XLA sums)
    refs = list(refs)
    gam_ref, r_ref = (refs.pop(0), refs.pop(0)) if packed else (g_ref, None)
    if has_acc:
        dq_acc_ref, dk_acc_ref, dg_acc_ref, *refs = refs
    dq_ref, dk_ref, dv_ref, dg_ref, db_ref = refs
    f32 = jnp.float32
    dt = k_ref.dtype
    # input-dtype operands: the forward's precision; float32 X products: full float32 for
    # float32 inputs, TF32 on the GPU for bf16/fp16 ones (X's entries need more than bf16)
    prec = common.dot_precision(dt)

    g = g_ref[...]                                         # (C,) in-chunk cumsum G
    beta = b_ref[...]                                      # (C,)
    x = x_ref[...]                                         # (C, C) float32 (I + A)^-1
    xd = x.astype(dt)
    gam = jnp.exp(gam_ref[...]) if packed else jnp.exp(g)
    bg = beta * gam
    # Ordered so that few (C, D) float32 tiles are live at once (Triton keeps them in
    # registers; this order compiles without spills at 8 warps, C64 D128): dV, then dX
    # (which needs no X^T dW), dA and its (C, C) terms, then dRk = X^T dW, then P's.

    # Ut = X Rv (the forward multiplies X and R in the input dtype)
    v = v_ref[...]
    dut = dut_ref[...]
    drv = mm(xd, dut, ta=True, precision=prec)            # (C, V)
    dv_ref[...] = (drv * beta[:, None]).astype(dv_ref.dtype)
    db = jnp.sum(drv * v.astype(f32), axis=1)
    rv = (v.astype(f32) * beta[:, None]).astype(dt)
    dx = mm(dut, rv, tb=True, precision=prec)
    # W = X Rk
    k = k_ref[...]
    rk = (k.astype(f32) * bg[:, None]).astype(dt)
    dx = dx + mm(dw_ref[...], rk, tb=True, precision=prec)

    # X = (I + A)^-1: dA = -X^T dX X^T, where A varies (strictly below the diagonal)
    dmat, rows, cols = decay_mask(g, chunk, r_ref[...] if packed else None)
    da = -mm(mm(x, dx, ta=True, precision=prec), x, tb=True, precision=prec)
    da = jnp.where(rows > cols, da, 0.0)
    kk = mm(k, k, tb=True, precision=prec)
    dad = da * dmat
    fa = dad * kk                                          # dL/d(beta_t) terms, per (t, s)
    db = db + jnp.sum(fa, axis=1)
    # dL/dD_ts * D_ts, through exp(G_t - G_s): + to row t, - to column s
    ma = fa * beta[:, None]
    dg = jnp.sum(ma, axis=1) - jnp.sum(ma, axis=0)
    dkk = dad * beta[:, None]                              # dL/d(K K^T) through A
    dk = mm((dkk + dkk.T).astype(dt), k, precision=prec)

    # dRk = X^T dW (dw read again: cheaper than keeping it and dRk live through dA)
    drk = mm(xd, dw_ref[...], ta=True, precision=prec)    # (C, K)
    dk = dk + drk * bg[:, None]
    rk_k = jnp.sum(drk * k.astype(f32), axis=1) * gam      # <dRk_t, k_t> gamma_t
    db_ref[...] = db + rk_k

    # P = (Q K^T) * D
    q = q_ref[...]
    qk = mm(q, k, tb=True, precision=prec)
    dqk = dp_ref[...].astype(f32) * dmat                   # dmat is 0 above the diagonal
    dqk_c = dqk.astype(dt)
    dq = mm(dqk_c, k, precision=prec)
    dk = dk + mm(dqk_c, q, ta=True, precision=prec)
    if has_acc:
        dq = dq + dq_acc_ref[...].astype(f32)
        dk = dk + dk_acc_ref[...].astype(f32)
        dg = dg + dg_acc_ref[...]
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    mp = dqk * qk
    last = lax.broadcasted_iota(jnp.int32, (chunk,), 0) == chunk - 1
    dgcl = jnp.sum(dgcl_ref[...], axis=0)                  # (1,): dL/dG_C = dL/dG_{C-1}
    dg_ref[...] = (dg + jnp.sum(mp, axis=1) - jnp.sum(mp, axis=0) + beta * rk_k
                   + jnp.where(last, dgcl, 0.0))


def gdn_prep_bwd(q, k, v, big_g, beta, inverse, dw, dut, dp, dgcl, *, chunk, tuning: Tuning,
                 add=None, documents=None):
    """VJP of gdn_prep.gdn_prep's (w, ut, p, gcl) (the same function as gdn.prep_xla with the
    in-chunk cumsum G given) from the saved float32 inverse.

    q, k (B,Tp,H,K), v (B,Tp,H,V) in one dtype; big_g, beta (B,Tp,H) float32; inverse
    (B*H, Tp, C) float32 (gdn_prep's with_inverse output); dw (B*H,Tp,K), dut (B*H,Tp,V),
    dp (B*H,Tp,C) and dgcl (B*H,N,1,1): the cotangents of gdn_prep's outputs.
    Returns dq, dk (B,Tp,H,K) and dv (B,Tp,H,V) in the input dtype, and dG (w.r.t.
    big_g), dbeta (B,Tp,H) float32. add: None or (dq, dk, dG) from another path (same
    shapes), summed into the returned dq, dk, dG inside the kernel. documents: as
    gdn_prep's (packed documents); the dG through W's masked gamma is returned as dG
    (where the mask keeps it, the masked weight is G itself)."""
    b, tp, h, kdim = q.shape
    vdim = v.shape[-1]
    n = tp // chunk
    dt = q.dtype
    for name, arr, shape in (("inverse", inverse, (b * h, tp, chunk)),
                             ("dw", dw, (b * h, tp, kdim)), ("dut", dut, (b * h, tp, vdim)),
                             ("dp", dp, (b * h, tp, chunk)), ("dgcl", dgcl, (b * h, n, 1, 1))):
        if tuple(arr.shape) != shape:
            raise ValueError(f"gdn_prep_bwd: {name} has shape {tuple(arr.shape)}, "
                             f"expected {shape} (gdn_prep's layout for chunk={chunk})")
    spec = common.chunk_specs(h, chunk)
    tok, per_tok, flat, scalar = spec.token, spec.per_token, spec.rows, spec.scalar
    out_shapes = [jax.ShapeDtypeStruct((b, tp, h, kdim), dt),
                  jax.ShapeDtypeStruct((b, tp, h, kdim), dt),
                  jax.ShapeDtypeStruct((b, tp, h, vdim), dt),
                  jax.ShapeDtypeStruct((b, tp, h), jnp.float32),
                  jax.ShapeDtypeStruct((b, tp, h), jnp.float32)]
    acc = []
    if add is not None:
        dq_add, dk_add, dg_add = add
        acc = [dq_add, dk_add, jnp.asarray(dg_add, jnp.float32)]
    packed = documents is not None
    doc_args = [documents[1], documents[0]] if packed else []     # gam, runs
    return pl.pallas_call(
        functools.partial(_prep_bwd_kernel, chunk=chunk, has_acc=bool(acc), packed=packed),
        grid=(b, h, n),
        in_specs=[tok(kdim), tok(kdim), tok(vdim), per_tok, per_tok, flat(chunk),
                  flat(kdim), flat(vdim), flat(chunk), scalar]
        + ([per_tok, spec.per_row] if packed else [])
        + ([tok(kdim), tok(kdim), per_tok] if acc else []),
        out_specs=[tok(kdim), tok(kdim), tok(vdim), per_tok, per_tok],
        out_shape=out_shapes, interpret=common.interpret(),
        compiler_params=common.compiler_params("gpu", num_warps=tuning.prep_bwd_warps,
                                               num_stages=1),
        name="gdn_chunk_prep_bwd")(
            q, k, v, jnp.asarray(big_g, jnp.float32), jnp.asarray(beta, jnp.float32),
            inverse, dw.astype(dt), dut.astype(dt), dp.astype(dt),
            jnp.asarray(dgcl, jnp.float32), *doc_args, *acc)
