"""The gated delta rule's per-chunk preparation as one Pallas (Triton) kernel: reads q, k, v
once in their (B, T, H, D) layout and writes W, Ut, P and G_C in the recurrence's
chunk-major layout (Qg = Q exp(G) and Kd = K exp(G_C - G) are formed inside the
recurrence kernel from q, k and G, not written here), instead of a dozen XLA passes over (C x C) tensors and a batched
triangular solve.

One program per (batch, head, chunk). The UT transform X = (I + A)^-1 is built from 16 x 16
blocks: each diagonal block (I + N) with N strictly lower triangular (nilpotent, N^16 = 0)
is inverted exactly as (I - N)(I + N^2)(I + N^4)(I + N^8) in float32 (IEEE) products, and
the off-diagonal blocks follow by block forward substitution,
    X_ij = -X_ii sum_{j <= m < i} A_im X_mj.
Within a 16-token block |A_ts| <= beta_t |k_t.k_s| <= 1 for unit keys, so the powers stay
small enough for float32 (the product form would lose digits only for near-identical
keys with beta ~ 1 and no decay over many tokens, which the 16-token blocks cap).

Backward: kernels.pallas.gdn wraps this in a custom VJP whose backward (gdn.PREP_BWD) is
either autodiff of the XLA preparation (the same function) with the saved X standing in
for the triangular solve (dA = -X^T dX X^T), batched matmuls only ("xla"), or the one-pass
kernel kernels.pallas.intra_bwd from the same saved X ("pallas").
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.pallas import common

BS = 16  # rows per diagonal block of the UT transform
# Warps per program; read when traced (KERNELS_PALLAS_PREP_WARPS; profile_kernels --tune).
# 8 was slower than 4 on the H200 (GDN fwd 0.64 -> 0.81 ms at B8 T2048).
NUM_WARPS = int(os.environ.get("KERNELS_PALLAS_PREP_WARPS", "4"))
# How many kernels the preparation is (read when traced; KERNELS_PALLAS_PREP_KERNELS):
#   1: this module's one kernel;
#   3: intra_split.py's three lighter ones (K K^T and P; the triangular solve; W and Ut);
#   2: intra_split.py's K K^T and the solve in one kernel (no A round trip through
#      memory), then W, Ut and P.
# (Two or three: X in the input dtype when no backward needs it.)
# 2 by default (session 6): with the solve's TF32 products (SOLVE_PRECISION) and its
# K K^T + solve kernel at 1 warp, the fastest on the H200 side by side (profile_kernels
# --tune-seq --settings prep, code d16bac1): GDN fwd 0.465 / 0.500 / 1.467 ms at B8 T2048,
# B2 T8192, B1 T32768 against three kernels' 0.472 / 0.506 / 1.483 (fla: 0.438 / 0.701 /
# 1.458 in that job). 3 was faster than 1 in session 5 (fwd 1.775 -> 1.696 ms at T32768).
PREP_KERNELS_CHOICES = (1, 2, 3)
PREP_KERNELS = int(os.environ.get("KERNELS_PALLAS_PREP_KERNELS", "2"))


def _mm(a, b, *, tb=False, precision=None):
    dims = (((1,), (1,) if tb else (0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision,
                           preferred_element_type=jnp.float32)


def _sum(terms):
    return functools.reduce(lambda a, b: a + b, terms)


def _decay_mask(g, chunk):
    """(D, rows, cols): D_ts = exp(G_t - G_s) for s <= t, else 0 (masked before the exp:
    above the diagonal G_t - G_s > 0 could overflow); g the (C,) in-chunk cumsum."""
    rows = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    cols = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    return jnp.exp(jnp.where(rows >= cols, g[:, None] - g[None, :], -jnp.inf)), rows, cols


# How _block_inverse inverts each 16 x 16 unit-lower diagonal block (read when traced;
# KERNELS_PALLAS_DIAG_INVERSE): "power", (I - N)(I + N^2)(I + N^4)(I + N^8), six
# dependent-in-pairs 16 x 16 float32 products; or "rows", forward substitution one row
# at a time with elementwise products and sums (no matrix products; what fla's
# solve_tril does for its 16 x 16 blocks). "power": "rows" was slower in every form timed
# on the H200 (session 6; docs/benchmarks.md).
DIAG_INVERSE_CHOICES = ("power", "rows")
DIAG_INVERSE = os.environ.get("KERNELS_PALLAS_DIAG_INVERSE", "power")


# The solve's products for bf16 / fp16 inputs (read when traced;
# KERNELS_PALLAS_SOLVE_PRECISION): "high" (TF32 on the GPU) or "highest" (float32 FMAs,
# what every input dtype used before session 6; profile_kernels --settings prep times both)
SOLVE_PRECISION_CHOICES = ("high", "highest")
SOLVE_PRECISION = os.environ.get("KERNELS_PALLAS_SOLVE_PRECISION", "high")


def solve_precision(dtype):
    """Precision of the float32 16 x 16 products of the solve for inputs of `dtype`: full
    float32 for float32 inputs; for bf16 / fp16 inputs Precision.HIGH, which Triton runs
    as one TF32 tensor-core pass (fla's solve_tril does the same) instead of float32 FMAs.
    Its ~1e-3 relative error is below the bf16 rounding X gets before W = X Rk anyway."""
    common.check_switch("intra.SOLVE_PRECISION", "KERNELS_PALLAS_SOLVE_PRECISION",
                        SOLVE_PRECISION, SOLVE_PRECISION_CHOICES)
    if jnp.dtype(dtype) == jnp.float32 or SOLVE_PRECISION == "highest":
        return lax.Precision.HIGHEST
    return lax.Precision.HIGH


def _block_inverse(a_block, nb, hi=lax.Precision.HIGHEST):
    """X = (I + A)^-1 as a dict of its 16 x 16 blocks X_ij (j <= i), A strictly lower with
    blocks a_block(i, m) (m <= i): each diagonal block by _unit_lower_inverse, the ones
    below by block forward substitution X_ij = -X_ii sum_{j <= m < i} A_im X_mj. hi: the
    products' precision (solve_precision)."""
    common.check_switch("intra.DIAG_INVERSE", "KERNELS_PALLAS_DIAG_INVERSE", DIAG_INVERSE,
                        DIAG_INVERSE_CHOICES)
    diag_inverse = (functools.partial(_unit_lower_inverse, hi=hi) if DIAG_INVERSE == "power"
                    else _unit_lower_inverse_rows)
    x = {}
    for i in range(nb):
        x[i, i] = diag_inverse(a_block(i, i))
        a_row = {m: a_block(i, m) for m in range(i)}
        for j in range(i - 1, -1, -1):
            acc = _sum(_mm(a_row[m], x[m, j], precision=hi) for m in range(j, i))
            x[i, j] = -_mm(x[i, i], acc, precision=hi)
    return x


def _a_blocks(k_of, g_of, b_of, prec):
    """a_block(i, j) for _block_inverse: A_ij = beta_i exp(G_i - G_j) (K_i K_j^T), strictly
    lower on the diagonal, from the 16-row blocks k_of(i), g_of(i), b_of(i)."""
    r16 = lax.broadcasted_iota(jnp.int32, (BS, BS), 0)
    c16 = lax.broadcasted_iota(jnp.int32, (BS, BS), 1)

    def a_block(i, j):
        mask = (r16 > c16) if i == j else (r16 >= 0)
        diff = jnp.where(mask, g_of(i)[:, None] - g_of(j)[None, :], -jnp.inf)
        return b_of(i)[:, None] * jnp.exp(diff) * _mm(k_of(i), k_of(j), tb=True,
                                                       precision=prec)
    return a_block


def _unit_lower_inverse_rows(n_mat):
    """(I + N)^-1 for a strictly lower-triangular 16 x 16 N, in float32, by forward
    substitution: row r of X is e_r - sum_{c < r} N_rc X_c (rows r.. of X are still
    identity rows while row r is formed, and N_rc = 0 for c >= r)."""
    rows = lax.broadcasted_iota(jnp.int32, (BS, BS), 0)
    cols = lax.broadcasted_iota(jnp.int32, (BS, BS), 1)
    x = (rows == cols).astype(jnp.float32)
    for r in range(1, BS):
        n_r = jnp.sum(jnp.where(rows == r, n_mat, 0.0), axis=0)      # N_r. over c
        row = jnp.sum(n_r[:, None] * x, axis=0)                      # sum_c N_rc X_c.
        x = jnp.where(rows == r, x - row[None, :], x)
    return x


def _unit_lower_inverse(n_mat, hi=lax.Precision.HIGHEST):
    """(I + N)^-1 for a strictly lower-triangular 16 x 16 N, in float32 (products at
    precision hi)."""
    eye = (lax.broadcasted_iota(jnp.int32, (BS, BS), 0)
           == lax.broadcasted_iota(jnp.int32, (BS, BS), 1)).astype(jnp.float32)
    x = eye - n_mat
    power = n_mat
    for _ in range(3):          # N^2, N^4, N^8
        power = _mm(power, power, precision=hi)
        x = _mm(x, eye + power, precision=hi)
    return x


def _intra_kernel(q_ref, k_ref, v_ref, g_ref, b_ref,
                  w_ref, ut_ref, p_ref, gcl_ref, *x_ref, chunk):
    f32 = jnp.float32
    dt = k_ref.dtype
    prec = common.dot_precision(dt)
    nb = chunk // BS

    # whole-chunk outputs: P, G_C
    q = q_ref[...]
    k = k_ref[...]
    g = g_ref[...]                                        # (C,) inclusive cumsum G
    g_last = g_ref[pl.ds(chunk - 1, 1)]                   # (1,)
    dmat = _decay_mask(g, chunk)[0]
    p_ref[...] = (_mm(q, k, tb=True, precision=prec) * dmat).astype(p_ref.dtype)
    gcl_ref[...] = g_last[None, :]

    # 16-row blocks of K, V, G, beta
    kb, gb, bb, rhs_k, rhs_v = [], [], [], [], []
    for i in range(nb):
        rows_i = pl.ds(i * BS, BS)
        k_i = k_ref[rows_i, :]
        g_i = g_ref[rows_i]
        b_i = b_ref[rows_i]
        kb.append(k_i)
        gb.append(g_i)
        bb.append(b_i)
        rhs_k.append((k_i.astype(f32) * (b_i * jnp.exp(g_i))[:, None]).astype(dt))
        rhs_v.append((v_ref[rows_i, :].astype(f32) * b_i[:, None]).astype(dt))

    x = _block_inverse(_a_blocks(kb.__getitem__, gb.__getitem__, bb.__getitem__, prec), nb,
                       solve_precision(dt))

    for i in range(nb):
        rows_i = pl.ds(i * BS, BS)
        for j in range(nb if x_ref else 0):   # X itself, only when a backward needs it
            x_ref[0][rows_i, pl.ds(j * BS, BS)] = (x[i, j] if j <= i
                                                   else jnp.zeros((BS, BS), f32))
        w_i = _sum(_mm(x[i, j].astype(dt), rhs_k[j], precision=prec) for j in range(i + 1))
        u_i = _sum(_mm(x[i, j].astype(dt), rhs_v[j], precision=prec) for j in range(i + 1))
        w_ref[rows_i, :] = w_i.astype(w_ref.dtype)
        ut_ref[rows_i, :] = u_i.astype(ut_ref.dtype)


def gdn_intra(q, k, v, big_g, beta, *, chunk, with_inverse=True):
    """q, k (B,Tp,H,K), v (B,Tp,H,V) in one dtype; big_g (in-chunk inclusive cumsum of the
    log-decays) and beta (B,Tp,H) float32. Returns the recurrence inputs
    (w, ut, p) each (B*H, Tp, .) in the input dtype and gcl (B*H, N, 1, 1), then,
    with_inverse only, the float32 inverse X = (I + A)^-1 per chunk as (B*H, Tp, C): the
    backward's stand-in for the triangular solve, 256 bytes per token and head that a
    forward without gradients need not write."""
    common.check_switch("intra.PREP_KERNELS", "KERNELS_PALLAS_PREP_KERNELS", PREP_KERNELS,
                        PREP_KERNELS_CHOICES)
    if PREP_KERNELS > 1:
        from kernels.pallas.intra_split import gdn_intra_split  # (it imports this module)
        return gdn_intra_split(q, k, v, big_g, beta, chunk=chunk, with_inverse=with_inverse,
                               kernels=PREP_KERNELS)
    b, tp, h, kdim = q.shape
    vdim = v.shape[-1]
    n = tp // chunk
    dt = q.dtype
    spec = common.chunk_specs(h, chunk)
    tok, per_tok, out = spec.token, spec.per_token, spec.rows
    out_shapes = [jax.ShapeDtypeStruct((b * h, tp, kdim), dt),
                  jax.ShapeDtypeStruct((b * h, tp, vdim), dt),
                  jax.ShapeDtypeStruct((b * h, tp, chunk), dt),
                  jax.ShapeDtypeStruct((b * h, n, 1, 1), jnp.float32)]
    out_specs = [out(kdim), out(vdim), out(chunk),
                 spec.scalar]
    if with_inverse:
        out_shapes.append(jax.ShapeDtypeStruct((b * h, tp, chunk), jnp.float32))
        out_specs.append(out(chunk))
    return pl.pallas_call(
        functools.partial(_intra_kernel, chunk=chunk), grid=(b, h, n),
        in_specs=[tok(kdim), tok(kdim), tok(vdim), per_tok, per_tok],
        out_specs=out_specs, out_shape=out_shapes, interpret=common.interpret(),
        compiler_params=common.compiler_params("gpu", num_warps=NUM_WARPS, num_stages=1),
        name="gdn_chunk_prep")(q, k, v, big_g, beta)
