"""Tile math shared by the Pallas kernels: plain `jnp` / `lax.dot_general` on loaded
tiles, so the same function serves the Triton (GPU) and Mosaic (TPU) programs and
interpret mode.

Recurrence, per chunk (S the (K, V) float32 state before it; G the in-chunk inclusive
cumsum of the log-decays, G_C its last entry; no decay: G = None):

    Qg = Q exp(G),  Kd = K exp(G_C - G),  U = Ut - W S  (U = Ut without W)
    O = Qg S + P U,  S' = exp(G_C) S + Kd^T U
    backward: dU = P^T dO + Kd dS',  dS = exp(G_C) dS' + Qg^T dO - W^T dU

Gated delta rule preparation: the UT transform X = (I + A)^-1 from 16 x 16 blocks. Each
diagonal block (I + N), N strictly lower (nilpotent), is inverted exactly as
(I - N)(I + N^2)(I + N^4)(I + N^8); the blocks below by block forward substitution
X_ij = -X_ii sum_{j <= m < i} A_im X_mj. With unit keys and beta in [0, 1] the entries
of a 16-row block of A are at most 1 in magnitude, so the powers stay within float32.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from kernels.pallas import common

BS = 16  # rows per diagonal block of the UT transform


def mm(a, b, *, ta=False, tb=False, precision=None):
    """a @ b with optional transposes, accumulated in float32."""
    dims = (((0,) if ta else (1,), (1,) if tb else (0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision,
                           preferred_element_type=jnp.float32)


def total(terms):
    """The sum of an iterable of arrays (a chain of adds, as written)."""
    return functools.reduce(lambda a, b: a + b, terms)


# ----------------------------------------------------------------------------- recurrence

def q_decayed(q, gam):
    """Qg = Q exp(G) in the input dtype; gam the float32 (C, 1) column G, or None."""
    if gam is None:
        return q
    return (q.astype(jnp.float32) * jnp.exp(gam)).astype(q.dtype)


def k_decayed(k, gam, gcl, gkey=None):
    """Kd = K exp(G_C - G) in the input dtype (gam None: Kd = K). gkey: the log key
    weights given instead (packed documents: G_C - G where the token is in the chunk's
    last document, else -inf), Kd = K exp(gkey)."""
    if gkey is not None:
        return (k.astype(jnp.float32) * jnp.exp(gkey)).astype(k.dtype)
    if gam is None:
        return k
    return (k.astype(jnp.float32) * jnp.exp(gcl - gam)).astype(k.dtype)


def chunk_values(ut, w, sc, prec):
    """U = Ut - W S (Ut without W) in the input dtype; sc the state in that dtype."""
    u = ut.astype(jnp.float32)
    if w is not None:
        u = u - mm(w, sc, precision=prec)
    return u.astype(ut.dtype)


def state_step(s, ut, w, k, gam, gcl, prec, gkey=None):
    """One chunk of the state recurrence: (S in the input dtype, U, S'); s float32."""
    sc = s.astype(ut.dtype)
    uc = chunk_values(ut, w, sc, prec)
    carried = jnp.exp(gcl) * s
    kd = k_decayed(k, gam, gcl, gkey)
    return sc, uc, carried + mm(kd, uc, ta=True, precision=prec)


def fwd_chunk(s, w, ut, q, k, p, gcl, gam, gkey=None):
    """One chunk of the forward: (O float32, S'); s float32 (K, BV)."""
    prec = common.dot_precision(ut.dtype)
    sc, uc, s_next = state_step(s, ut, w, k, gam, gcl, prec, gkey)
    o = mm(q_decayed(q, gam), sc, precision=prec) + mm(p, uc, precision=prec)
    return o, s_next


def dstate_step(ds, w, q, k, p, gam, gcl, doc, prec, gkey=None):
    """One chunk of the dS recurrence, last to first: (dS' in the input dtype, dU, dS);
    ds float32 (K, BV) is the gradient w.r.t. the state after the chunk."""
    dt = doc.dtype
    qg, kd = q_decayed(q, gam), k_decayed(k, gam, gcl, gkey)
    dsc = ds.astype(dt)
    du = (mm(p, doc, ta=True, precision=prec) + mm(kd, dsc, precision=prec)).astype(dt)
    ds = jnp.exp(gcl) * ds + mm(qg, doc, ta=True, precision=prec)
    if w is not None:
        ds = ds - mm(w, du, ta=True, precision=prec)
    return dsc, du, ds


def bwd_chunk(s, ds, w, ut, q, k, p, gcl, gam, do, gkey=None):
    """Vector-Jacobian product of one chunk (the TPU backward's body). s: the chunk-start
    state, ds: dL/d(next state). Returns (ds_prev, dut, dw, dqg, dkd, dp, dgcl) with dqg,
    dkd w.r.t. Qg, Kd (the decay factors are applied by the caller)."""
    dt = ut.dtype
    prec = common.dot_precision(dt)
    sc = s.astype(dt)
    doc = do.astype(dt)
    uc = chunk_values(ut, w, sc, prec)
    dsc, du, ds_prev = dstate_step(ds, w, q, k, p, gam, gcl, doc, prec, gkey)
    dw = None if w is None else -mm(du, sc, tb=True, precision=prec)
    dqg = mm(doc, sc, tb=True, precision=prec)
    dp = mm(doc, uc, tb=True, precision=prec)
    dkd = mm(uc, dsc, tb=True, precision=prec)
    dgcl = jnp.exp(gcl) * jnp.sum(jnp.sum(s * ds, axis=1, keepdims=True), axis=0,
                                  keepdims=True)
    return ds_prev, du, dw, dqg, dkd, dp, dgcl


def split_refs(refs, has_w, has_g, has_key=False):
    """Kernel refs in call order: [w] ut q k p gcl [gam] [gkey], then the rest (returned
    after the first tuple; gkey's ref last in it)."""
    refs = list(refs)
    w_ref = refs.pop(0) if has_w else None
    ut_ref, q_ref, k_ref, p_ref, gcl_ref = refs[:5]
    refs = refs[5:]
    g_ref = refs.pop(0) if has_g else None
    key_ref = refs.pop(0) if has_key else None
    return (w_ref, ut_ref, q_ref, k_ref, p_ref, gcl_ref, g_ref, key_ref), refs


# ----------------------------------------------------------------------------- UT transform

def decay_mask(g, chunk, runs=None):
    """(D, rows, cols): D_ts = exp(G_t - G_s) for s <= t, else 0 (masked before the exp:
    above the diagonal G_t - G_s > 0 could overflow); g the (C,) in-chunk cumsum. runs:
    the (C,) run index of each token (packed documents): D is 0 across runs too."""
    rows = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    cols = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    mask = rows >= cols
    if runs is not None:
        mask = mask & (runs[:, None] == runs[None, :])
    return jnp.exp(jnp.where(mask, g[:, None] - g[None, :], -jnp.inf)), rows, cols


def solve_precision(dtype, setting: str):
    """Precision of the UT solve's float32 16 x 16 products for inputs of `dtype`: IEEE
    float32 for float32 inputs or setting "highest"; otherwise Precision.HIGH, which
    Triton runs as one TF32 tensor-core pass (Tuning.solve_precision)."""
    if jnp.dtype(dtype) == jnp.float32 or setting == "highest":
        return lax.Precision.HIGHEST
    return lax.Precision.HIGH


def a_blocks(k_of, g_of, b_of, prec, runs_of=None):
    """a_block(i, j) for block_inverse: A_ij = beta_i exp(G_i - G_j) (K_i K_j^T), strictly
    lower on the diagonal, from the 16-row blocks k_of(i), g_of(i), b_of(i); with
    runs_of(i), the blocks' run indices, 0 across runs (packed documents)."""
    r16 = lax.broadcasted_iota(jnp.int32, (BS, BS), 0)
    c16 = lax.broadcasted_iota(jnp.int32, (BS, BS), 1)

    def a_block(i, j):
        mask = (r16 > c16) if i == j else (r16 >= 0)
        if runs_of is not None:
            mask = mask & (runs_of(i)[:, None] == runs_of(j)[None, :])
        diff = jnp.where(mask, g_of(i)[:, None] - g_of(j)[None, :], -jnp.inf)
        return b_of(i)[:, None] * jnp.exp(diff) * mm(k_of(i), k_of(j), tb=True,
                                                      precision=prec)
    return a_block


def unit_lower_inverse(n_mat, hi=lax.Precision.HIGHEST):
    """(I + N)^-1 for a strictly lower-triangular 16 x 16 N, in float32 (products at
    precision hi)."""
    eye = (lax.broadcasted_iota(jnp.int32, (BS, BS), 0)
           == lax.broadcasted_iota(jnp.int32, (BS, BS), 1)).astype(jnp.float32)
    x = eye - n_mat
    power = n_mat
    for _ in range(3):          # N^2, N^4, N^8
        power = mm(power, power, precision=hi)
        x = mm(x, eye + power, precision=hi)
    return x


def block_inverse(a_block, nb, hi=lax.Precision.HIGHEST):
    """X = (I + A)^-1 as a dict of its 16 x 16 blocks X_ij (j <= i), A strictly lower with
    blocks a_block(i, m) (m <= i). hi: the products' precision (solve_precision)."""
    x = {}
    for i in range(nb):
        x[i, i] = unit_lower_inverse(a_block(i, i), hi=hi)
        a_row = {m: a_block(i, m) for m in range(i)}
        for j in range(i - 1, -1, -1):
            acc = total(mm(a_row[m], x[m, j], precision=hi) for m in range(j, i))
            x[i, j] = -mm(x[i, i], acc, precision=hi)
    return x
