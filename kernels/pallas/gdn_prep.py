"""The gated delta rule's per-chunk preparation on the GPU, as two Pallas (Triton) kernels
per (batch, head, chunk):

1. _kkt_solve_kernel: G_C and X = (I + A)^-1 from K alone, A's 16 x 16 blocks
   A_ts = strict_lower(beta_t D_ts k_t.k_s) formed from 16-row blocks of K as the
   blocked solve (tiles.block_inverse) needs them, so A never goes through memory and no
   whole tile stays live through the solve's chain of small products;
2. _wu_p_kernel: W = X diag(beta gamma) K, Ut = X diag(beta) V and P = (Q K^T) * D.

D_ts = exp(G_t - G_s) for s <= t (0 above), gamma = exp(G), G the in-chunk cumsum of the
log-decays. The split keeps the solve (latency-bound, few registers) apart from the large
dots, so many solve programs share an SM (the split of fla's chunk_gated_delta_rule
forward). X is written in float32 when a backward needs it (with_inverse), else in the
input dtype, which the W/Ut products use either way (the same outputs).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.pallas import common, tiles
from kernels.pallas.tiles import BS
from kernels.pallas.tuning import Tuning


def _write_inverse(x_ref, x, nb):
    """X's 16 x 16 blocks (zeros above the diagonal) into x_ref, in its dtype."""
    for i in range(nb):
        for j in range(nb):
            x_ref[pl.ds(i * BS, BS), pl.ds(j * BS, BS)] = (
                x[i, j] if j <= i else jnp.zeros((BS, BS), jnp.float32)).astype(x_ref.dtype)


def _kkt_solve_kernel(*refs, chunk, solve_setting, packed):
    # packed: a run-index input after beta (packed documents: A is 0 across runs)
    k_ref, g_ref, b_ref, *refs = refs
    r_ref = refs.pop(0) if packed else None
    gcl_ref, x_ref = refs
    prec = common.dot_precision(k_ref.dtype)
    gcl_ref[...] = g_ref[pl.ds(chunk - 1, 1)][None, :]
    block = lambda ref: lambda i: ref[pl.ds(i * BS, BS)]  # noqa: E731
    rows = lambda i: k_ref[pl.ds(i * BS, BS), :]  # noqa: E731
    nb = chunk // BS
    hi = tiles.solve_precision(k_ref.dtype, solve_setting)
    a_block = tiles.a_blocks(rows, block(g_ref), block(b_ref), prec,
                             block(r_ref) if packed else None)
    _write_inverse(x_ref, tiles.block_inverse(a_block, nb, hi), nb)


def _wu_p_kernel(*refs, chunk, packed):
    # packed: the masked log weight of the incoming state (gam) and the run indices after
    # beta; W's gamma is then exp(gam), P's decay is 0 across runs
    x_ref, q_ref, k_ref, v_ref, g_ref, b_ref, *refs = refs
    gam_ref, r_ref = (refs.pop(0), refs.pop(0)) if packed else (g_ref, None)
    w_ref, ut_ref, p_ref = refs
    f32 = jnp.float32
    dt = k_ref.dtype
    prec = common.dot_precision(dt)
    bt = b_ref[...][:, None]
    xd = x_ref[...].astype(dt)
    rhs_k = (k_ref[...].astype(f32) * (bt * jnp.exp(gam_ref[...][:, None]))).astype(dt)
    rhs_v = (v_ref[...].astype(f32) * bt).astype(dt)
    w_ref[...] = tiles.mm(xd, rhs_k, precision=prec).astype(w_ref.dtype)
    ut_ref[...] = tiles.mm(xd, rhs_v, precision=prec).astype(ut_ref.dtype)
    q, k = q_ref[...], k_ref[...]
    dmat = tiles.decay_mask(g_ref[...], chunk, r_ref[...] if packed else None)[0]
    p_ref[...] = (tiles.mm(q, k, tb=True, precision=prec) * dmat).astype(p_ref.dtype)


def gdn_prep(q, k, v, big_g, beta, *, chunk, tuning: Tuning, with_inverse=True,
             documents=None):
    """q, k (B,Tp,H,K), v (B,Tp,H,V) in one dtype; big_g (in-chunk inclusive cumsum of the
    log-decays) and beta (B,Tp,H) float32. Returns the recurrence inputs (w, ut, p), each
    (B*H, Tp, .) in the input dtype, and gcl (B*H, N, 1, 1); then, with_inverse only, the
    float32 inverse X = (I + A)^-1 per chunk as (B*H, Tp, C): the backward's stand-in for
    the triangular solve, which a forward without gradients need not write.
    documents: None, or (runs (B,Tp) int32, gam (B,Tp,H) float32) for packed documents
    (kernels.pallas.documents: the run indices and the masked log weight of the incoming
    state)."""
    b, tp, h, kdim = q.shape
    vdim = v.shape[-1]
    n = tp // chunk
    dt = q.dtype
    f32 = jnp.float32
    grid = (b, h, n)
    spec = common.chunk_specs(h, chunk)
    tok, per_tok, rows, one = spec.token, spec.per_token, spec.rows, spec.scalar
    params = lambda warps: common.compiler_params("gpu", num_warps=warps,  # noqa: E731
                                                  num_stages=1)
    packed = documents is not None
    runs, gam = documents if packed else (None, None)
    gcl, x = pl.pallas_call(
        functools.partial(_kkt_solve_kernel, chunk=chunk,
                          solve_setting=tuning.solve_precision, packed=packed),
        grid=grid,
        in_specs=[tok(kdim), per_tok, per_tok] + ([spec.per_row] if packed else []),
        out_specs=[one, rows(chunk)],
        out_shape=[jax.ShapeDtypeStruct((b * h, n, 1, 1), f32),
                   jax.ShapeDtypeStruct((b * h, tp, chunk), f32 if with_inverse else dt)],
        interpret=common.interpret(), compiler_params=params(tuning.kkt_solve_warps),
        name="gdn_chunk_prep_kkt_solve")(k, big_g, beta, *([runs] if packed else []))
    w, ut, p = pl.pallas_call(
        functools.partial(_wu_p_kernel, chunk=chunk, packed=packed), grid=grid,
        in_specs=[rows(chunk), tok(kdim), tok(kdim), tok(vdim), per_tok, per_tok]
        + ([per_tok, spec.per_row] if packed else []),
        out_specs=[rows(kdim), rows(vdim), rows(chunk)],
        out_shape=[jax.ShapeDtypeStruct((b * h, tp, kdim), dt),
                   jax.ShapeDtypeStruct((b * h, tp, vdim), dt),
                   jax.ShapeDtypeStruct((b * h, tp, chunk), dt)],
        interpret=common.interpret(), compiler_params=params(tuning.wu_warps),
        name="gdn_chunk_prep_wu")(x, q, k, v, big_g, beta,
                                  *([gam, runs] if packed else []))
    outs = [w, ut, p, gcl]
    return outs + [x] if with_inverse else outs
