"""The gated delta rule's per-chunk preparation as two or three light Pallas (Triton)
kernels instead of intra.py's one (switch `intra.PREP_KERNELS`; same outputs, same math).

intra.py's one program per (head, chunk) holds q, k, v tiles and runs the UT transform as
~40 dependent 16 x 16 products, so few programs fit on an SM and the chain's latency is
not hidden (on the H200 it runs at ~3.6x its memory floor). Here, per (head, chunk):

    three kernels (PREP_KERNELS = 3):
    1. _kkt_kernel:   P = (Q K^T) * D,  A = strict_lower(beta_t D_ts (K K^T)_ts),  G_C
                      (two C x C x K dots; A written in float32)
    2. _solve_kernel: X = (I + A)^-1 from A's 16 x 16 blocks (intra._block_inverse: the
                      same blocked inverse as the one-kernel preparation): the
                      small-register part, so many programs share an SM
    3. _wu_kernel:    W = X diag(beta gamma) K,  Ut = X diag(beta) V  (two C x C x D dots)

    two kernels (PREP_KERNELS = 2, the default; the split of fla's chunk_gated_delta_rule
    forward, whose K K^T and solve kernel is one):
    1. _kkt_solve_kernel: G_C and X from K alone, A's blocks formed from 16-row blocks of
                      K as the solve needs them (A never goes through memory)
    2. _wu_p_kernel:  W, Ut and P = (Q K^T) * D (so the first kernel reads no Q tile;
                      fla forms Q K^T later still, in its output kernel)

D_ts = exp(G_t - G_s) for s <= t (0 above), gamma = exp(G). X is written in float32 when
a backward needs it (with_inverse; it reads X), else in the input dtype: _wu_kernel
multiplies in the input dtype either way, so the outputs are the same. Our own code.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.pallas import common
from kernels.pallas.intra import (BS, _a_blocks, _block_inverse, _decay_mask, _mm,
                                  solve_precision)

# Warps per program of the kernels; read when traced (environment variables
# KERNELS_PALLAS_{SOLVE,KKT_SOLVE,WU}_WARPS; profile_kernels --tune-seq --settings prep
# times them). The fused K K^T + solve at 1 warp: 0.465 / 0.500 / 1.467 ms GDN fwd against
# 0.582 / 0.615 / 1.706 at 2 and 0.752 / 0.785 / 2.048 at 4 (H200, session 6; those two
# with the "highest" solve precision). The W/Ut(/P) kernel at 8 warps: GDN fwd+bwd
# 1.938 -> 1.907 ms at B2 T8192, 4.655 -> 4.569 ms at B1 T32768, fwd 1.493 -> 1.486 ms at
# B1 T32768 and 0.467 -> 0.472 at B8 T2048 against 4 (2: slower everywhere; session 6,
# profile_kernels --tune-seq --settings warps). The K K^T kernel's 4: untuned.
KKT_WARPS = 4
SOLVE_WARPS = int(os.environ.get("KERNELS_PALLAS_SOLVE_WARPS", "1"))
KKT_SOLVE_WARPS = int(os.environ.get("KERNELS_PALLAS_KKT_SOLVE_WARPS", "1"))
WU_WARPS = int(os.environ.get("KERNELS_PALLAS_WU_WARPS", "8"))


def _p_tile(q, k, dmat, prec):
    """P = (Q K^T) * D for one chunk (D: the decay mask), float32."""
    return _mm(q, k, tb=True, precision=prec) * dmat


def _kkt_kernel(q_ref, k_ref, g_ref, b_ref, p_ref, a_ref, gcl_ref, *, chunk):
    prec = common.dot_precision(k_ref.dtype)
    k = k_ref[...]
    g = g_ref[...]
    dmat, rows, cols = _decay_mask(g, chunk)
    p_ref[...] = _p_tile(q_ref[...], k, dmat, prec).astype(p_ref.dtype)
    kk = _mm(k, k, tb=True, precision=prec)
    a_ref[...] = jnp.where(rows > cols, b_ref[...][:, None] * dmat * kk, 0.0)
    gcl_ref[...] = g_ref[pl.ds(chunk - 1, 1)][None, :]


def _write_inverse(x_ref, x, nb):
    """X's 16 x 16 blocks (zeros above the diagonal) into x_ref, in its dtype."""
    for i in range(nb):
        for j in range(nb):
            x_ref[pl.ds(i * BS, BS), pl.ds(j * BS, BS)] = (
                x[i, j] if j <= i else jnp.zeros((BS, BS), jnp.float32)).astype(x_ref.dtype)


def _solve_kernel(a_ref, x_ref, *, chunk, dtype):
    # dtype: the inputs' (A is float32 whatever they are), for the products' precision
    nb = chunk // BS
    x = _block_inverse(lambda i, m: a_ref[pl.ds(i * BS, BS), pl.ds(m * BS, BS)], nb,
                       solve_precision(dtype))
    _write_inverse(x_ref, x, nb)


def _kkt_solve_kernel(k_ref, g_ref, b_ref, gcl_ref, x_ref, *, chunk):
    """G_C and X from K alone (P is _wu_p_kernel's, so no Q tile here): A's blocks from
    16-row blocks of K read from the ref as the solve needs them (cache hits), so no
    whole tile stays live through the solve's chain."""
    prec = common.dot_precision(k_ref.dtype)
    gcl_ref[...] = g_ref[pl.ds(chunk - 1, 1)][None, :]
    block = lambda ref: lambda i: ref[pl.ds(i * BS, BS)]  # noqa: E731
    rows = lambda i: k_ref[pl.ds(i * BS, BS), :]  # noqa: E731
    nb = chunk // BS
    _write_inverse(x_ref, _block_inverse(_a_blocks(rows, block(g_ref), block(b_ref), prec),
                                         nb, solve_precision(k_ref.dtype)), nb)


def _wu_kernel(x_ref, k_ref, v_ref, g_ref, b_ref, w_ref, ut_ref):
    f32 = jnp.float32
    dt = k_ref.dtype
    prec = common.dot_precision(dt)
    bt = b_ref[...][:, None]
    xd = x_ref[...].astype(dt)
    rhs_k = (k_ref[...].astype(f32) * (bt * jnp.exp(g_ref[...][:, None]))).astype(dt)
    rhs_v = (v_ref[...].astype(f32) * bt).astype(dt)
    w_ref[...] = _mm(xd, rhs_k, precision=prec).astype(w_ref.dtype)
    ut_ref[...] = _mm(xd, rhs_v, precision=prec).astype(ut_ref.dtype)


def _wu_p_kernel(x_ref, q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, ut_ref, p_ref, *, chunk):
    """_wu_kernel and P (the two-kernel form: fla's forms Q K^T in its output kernel)."""
    _wu_kernel(x_ref, k_ref, v_ref, g_ref, b_ref, w_ref, ut_ref)
    p_ref[...] = _p_tile(q_ref[...], k_ref[...], _decay_mask(g_ref[...], chunk)[0],
                         common.dot_precision(k_ref.dtype)).astype(p_ref.dtype)


def gdn_intra_split(q, k, v, big_g, beta, *, chunk, with_inverse=True, kernels=3):
    """intra.gdn_intra's contract (same arguments, outputs and layouts), in `kernels` (2 or
    3) calls."""
    if kernels not in (2, 3):
        raise ValueError(f"gdn_intra_split: kernels must be 2 or 3, got {kernels!r}")
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
    p_shape = jax.ShapeDtypeStruct((b * h, tp, chunk), dt)
    gcl_shape = jax.ShapeDtypeStruct((b * h, n, 1, 1), f32)
    # X in float32 for the backward, else in the dtype _wu_kernel multiplies it in
    x_shape = jax.ShapeDtypeStruct((b * h, tp, chunk), f32 if with_inverse else dt)
    w_shape = jax.ShapeDtypeStruct((b * h, tp, kdim), dt)
    ut_shape = jax.ShapeDtypeStruct((b * h, tp, vdim), dt)
    if kernels == 2:
        gcl, x = pl.pallas_call(
            functools.partial(_kkt_solve_kernel, chunk=chunk), grid=grid,
            in_specs=[tok(kdim), per_tok, per_tok], out_specs=[one, rows(chunk)],
            out_shape=[gcl_shape, x_shape],
            interpret=common.interpret(), compiler_params=params(KKT_SOLVE_WARPS),
            name="gdn_chunk_prep_kkt_solve")(k, big_g, beta)
        w, ut, p = pl.pallas_call(
            functools.partial(_wu_p_kernel, chunk=chunk), grid=grid,
            in_specs=[rows(chunk), tok(kdim), tok(kdim), tok(vdim), per_tok, per_tok],
            out_specs=[rows(kdim), rows(vdim), rows(chunk)],
            out_shape=[w_shape, ut_shape, p_shape],
            interpret=common.interpret(), compiler_params=params(WU_WARPS),
            name="gdn_chunk_prep_wu")(x, q, k, v, big_g, beta)
        outs = [w, ut, p, gcl]
        return outs + [x] if with_inverse else outs
    p, a, gcl = pl.pallas_call(
        functools.partial(_kkt_kernel, chunk=chunk), grid=grid,
        in_specs=[tok(kdim), tok(kdim), per_tok, per_tok],
        out_specs=[rows(chunk), rows(chunk), one],
        out_shape=[p_shape, jax.ShapeDtypeStruct((b * h, tp, chunk), f32), gcl_shape],
        interpret=common.interpret(), compiler_params=params(KKT_WARPS),
        name="gdn_chunk_prep_kkt")(q, k, big_g, beta)
    x = pl.pallas_call(
        functools.partial(_solve_kernel, chunk=chunk, dtype=dt), grid=grid,
        in_specs=[rows(chunk)], out_specs=rows(chunk), out_shape=x_shape,
        interpret=common.interpret(), compiler_params=params(SOLVE_WARPS),
        name="gdn_chunk_prep_solve")(a)
    w, ut = pl.pallas_call(
        _wu_kernel, grid=grid,
        in_specs=[rows(chunk), tok(kdim), tok(vdim), per_tok, per_tok],
        out_specs=[rows(kdim), rows(vdim)], out_shape=[w_shape, ut_shape],
        interpret=common.interpret(), compiler_params=params(WU_WARPS),
        name="gdn_chunk_prep_wu")(x, k, v, big_g, beta)
    outs = [w, ut, p, gcl]
    return outs + [x] if with_inverse else outs
