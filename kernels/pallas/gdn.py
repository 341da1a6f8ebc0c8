"""Gated delta rule, chunkwise, on the Pallas recurrence (algebra: CHUNKWISE notes in
kernels/README.md).

Per chunk (parallel): A_ts = beta_t exp(G_t - G_s) k_t.k_s (s < t); the UT transform
(I + A) [W, Ut] = diag(beta) [K * gamma, V]; P, G_C. On GPU one Pallas kernel
(kernels.pallas.intra) does all of it in one pass; its backward is either autodiff of
the XLA form below with the kernel's saved inverse, or the Pallas kernel
kernels.pallas.intra_bwd (PREP_BWD). On TPU / in the reference path the whole preparation
is the XLA form below (batched matmuls and a triangular solve). Then the sequential
kernel forms Qg, Kd (from q, k and the in-chunk cumulative decay G) and U = Ut - W S per
chunk.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax import lax

from kernels.pallas import common, prep, recurrence
from kernels.pallas.intra import gdn_intra
from kernels.pallas.intra_bwd import gdn_intra_bwd
from kernels.pallas.recurrence import Config, block_v, chunk_recurrence

# Backward of the fused (Pallas) preparation: "xla" = autodiff of prep_xla with the saved
# inverse (batched XLA matmuls), "pallas" = the one-pass kernel kernels.pallas.intra_bwd
# (the default: on the H200, GDN fwd+bwd 5.24 -> 4.24 ms at B2 T8192, 13.2 -> 11.2 ms at
# B1 T32768, same bf16 error; docs/benchmarks.md). Read when the backward is traced (set
# it before jit traces a gradient: a cached trace keeps its choice). Set by the
# environment (KERNELS_GDN_PREP_BWD=xla) or by assigning this name.
PREP_BWD_CHOICES = ("xla", "pallas")
PREP_BWD = os.environ.get("KERNELS_GDN_PREP_BWD", "pallas")


@jax.custom_vjp
def _known_inverse(a, x):
    """x = (I + a)^-1, already computed (by the Pallas kernel); gives a its gradient."""
    del a
    return x


def _known_inverse_fwd(a, x):
    return x, x


def _known_inverse_bwd(x, dx):
    xt = jnp.swapaxes(x, -1, -2)
    hp = jax.lax.Precision.HIGHEST
    da = -jnp.einsum("...ij,...jk,...kl->...il", xt, dx, xt, precision=hp)
    return da, jnp.zeros_like(x)


_known_inverse.defvjp(_known_inverse_fwd, _known_inverse_bwd)


def prep_xla(q, k, v, g, beta, chunk, inverse=None):
    """q, k, v (B,Tp,H,.) input dtype; g, beta (B,Tp,H) float32. Returns the recurrence
    inputs (w, ut, p) as (B*H, Tp, .) in the input dtype and gcl (B*H, N, 1, 1).
    inverse: the float32 (I + A)^-1 per chunk as (B*H, Tp, C), when already known."""
    b, tp, h, kdim = q.shape
    c = chunk
    n = tp // c
    dtype = q.dtype
    qc, kc, vc = (prep.chunked(x, b, h, n, c) for x in (q, k, v))
    gc, betac = prep.chunked(g, b, h, n, c), prep.chunked(beta, b, h, n, c)
    big_g, dmat, incl = prep.decay_terms(gc)
    p, gcl = prep.intra_chunk(qc, kc, dmat, big_g, dtype)
    strict = incl & ~jnp.eye(c, dtype=bool)
    kk = prep.einsum("bhntd,bhnsd->bhnts", kc, kc, dtype=dtype)
    a = jnp.where(strict, betac[..., :, None] * dmat * kk, 0.0)
    rhs = betac[..., None] * jnp.concatenate(
        [kc.astype(jnp.float32) * jnp.exp(big_g)[..., None], vc.astype(jnp.float32)], -1)
    if inverse is None:
        x = lax.linalg.triangular_solve(a + jnp.eye(c, dtype=jnp.float32), rhs,
                                        left_side=True, lower=True, unit_diagonal=True)
    else:
        inv = _known_inverse(a, inverse.reshape(b, h, n, c, c))
        x = jnp.einsum("bhnts,bhnsd->bhntd", inv, rhs, precision=common.dot_precision(dtype))
    w, ut = x[..., :kdim], x[..., kdim:]
    return (*(prep.flat(t.astype(dtype)) for t in (w, ut, p)),
            gcl.reshape(b * h, n, 1, 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def prep_pallas(q, k, v, g, beta, chunk):
    """prep_xla computed by the one-pass Pallas kernel; backward (PREP_BWD) through
    prep_xla or by the Pallas kernel gdn_intra_bwd, both from the saved inverse X.
    Without a gradient (this primal) the kernel skips writing the inverse X."""
    return _prep_pallas(q, k, v, g, beta, chunk, with_inverse=False)


def _prep_pallas(q, k, v, g, beta, chunk, *, with_inverse):
    big_g = prep.in_chunk_cumsum(g, chunk)
    return tuple(gdn_intra(q, k, v, big_g, beta, chunk=chunk, with_inverse=with_inverse))


def _prep_fwd(q, k, v, g, beta, chunk):
    *outs, inverse = _prep_pallas(q, k, v, g, beta, chunk, with_inverse=True)
    return tuple(outs), (q, k, v, g, beta, inverse)


def _prep_bwd(chunk, res, cts):
    *inputs, inverse = res
    if PREP_BWD == "xla":
        _, pull = jax.vjp(lambda *a: prep_xla(*a, chunk, inverse), *inputs)
        return pull(cts)
    common.check_switch("gdn.PREP_BWD", "KERNELS_GDN_PREP_BWD", PREP_BWD, PREP_BWD_CHOICES)
    q, k, v, g, beta = inputs
    return _prep_pallas_vjp(q, k, v, prep.in_chunk_cumsum(g, chunk), beta, inverse, cts,
                            chunk)


def _prep_pallas_vjp(q, k, v, big_g, beta, inverse, cts, chunk, add=None):
    """(dq, dk, dv, dg, dbeta) of the preparation by the Pallas kernel gdn_intra_bwd from
    its outputs' cotangents cts = (dw, dut, dp, dgcl); add: (dq, dk, dG) of another path,
    summed in the kernel."""
    dq, dk, dv, dbig_g, dbeta = gdn_intra_bwd(q, k, v, big_g, beta, inverse, *cts,
                                              chunk=chunk, add=add)
    # G = in-chunk cumsum of g, so dg is the reverse in-chunk cumsum of dG
    return dq, dk, dv, prep.in_chunk_cumsum(dbig_g, chunk, reverse=True), dbeta


prep_pallas.defvjp(_prep_fwd, _prep_bwd)


# One custom VJP over the fused preparation and the recurrence (GPU): its backward gives
# the recurrence's dq, dk and dG to the preparation-backward kernel, which adds them in
# place of XLA's sums of the two paths' cotangents (an XLA `wrapped_add`: 0.095 ms at B2
# T8192, 0.187 ms at B1 T32768). Same numbers (tests/kernels/test_pallas_prep_bwd.py).
# On by default since timed side by side on the H200: GDN fwd+bwd 2.180 -> 2.116 ms at
# B2 T8192 (docs/benchmarks.md). KERNELS_GDN_FUSED_VJP=0 or FUSED_VJP = False for the
# two-VJP path (which PREP_BWD = "xla" also selects).
FUSED_VJP = os.environ.get("KERNELS_GDN_FUSED_VJP", "1") == "1"


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _fused(q, k, v, g, beta, s0, cfg: Config):
    big_g = prep.in_chunk_cumsum(g, cfg.chunk)
    w, ut, p, gcl = gdn_intra(q, k, v, big_g, beta, chunk=cfg.chunk, with_inverse=False)
    o, st = recurrence.chunk_recurrence(w, ut, q, k, p, gcl, big_g, s0, cfg)
    return o, st


def _fused_fwd(q, k, v, g, beta, s0, cfg):
    big_g = prep.in_chunk_cumsum(g, cfg.chunk)
    w, ut, p, gcl, inverse = gdn_intra(q, k, v, big_g, beta, chunk=cfg.chunk,
                                       with_inverse=True)
    (o, st), res = recurrence._vjp_fwd(w, ut, q, k, p, gcl, big_g, s0, cfg)
    return (o, st), (v, beta, inverse, res)


def _fused_bwd(cfg, saved, cts):
    v, beta, inverse, res = saved
    w, ut, q, k, p, gcl, big_g, h, u = res
    do, dst = cts
    dw, dut, dq, dk, dp, dgcl, dgam, ds0 = recurrence._backward_gpu(
        w, ut, q, k, p, gcl, big_g, h, do, dst.astype(jnp.float32), cfg, u=u)
    return (*_prep_pallas_vjp(q, k, v, big_g, beta, inverse, (dw, dut, dp, dgcl), cfg.chunk,
                              add=(dq, dk, dgam)), ds0)


_fused.defvjp(_fused_fwd, _fused_bwd)


def gated_delta_rule(q, k, v, log_alpha, beta, *, initial_state=None, return_state=False,
                     chunk_size=64, segment_ids=None, variant=None, fused_prep=None,
                     block_v_cols=None):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T ; o_t = S_t^T q_t.

    q, k: (B,T,H,K); v: (B,T,H,V); log_alpha, beta: (B,T,H). State (B,H,K,V) float32.
    Returns o (B,T,H,V) in the input dtype, or (o, state) with return_state=True.
    fused_prep: use the one-pass Pallas preparation (default: on the "gpu" variant).
    block_v_cols: force the value columns per GPU program (tuning; default adaptive).
    """
    op = "kernels.pallas.gated_delta_rule"
    variant, dtype = common.check_inputs(op, q, k, v, segment_ids=segment_ids,
                                         chunk_size=chunk_size, variant=variant)
    b, t, h, kdim = q.shape
    vdim = v.shape[-1]
    if fused_prep is None:
        fused_prep = variant == "gpu"
    c = chunk_size
    n = -(-t // c)
    tp = n * c
    q, k, v = (common.pad_time(x.astype(dtype), tp) for x in (q, k, v))
    g = common.pad_time(jnp.asarray(log_alpha, jnp.float32), tp)
    bt = common.pad_time(jnp.asarray(beta, jnp.float32), tp)

    s0 = (jnp.zeros((b, h, kdim, vdim), jnp.float32) if initial_state is None
          else jnp.asarray(initial_state, jnp.float32)).reshape(b * h, kdim, vdim)
    cfg = Config(chunk=c, variant=variant, out_dtype=jnp.dtype(dtype).name,
                 block_v=block_v(kdim, vdim, variant, b * h, block_v_cols))
    # the fused VJP has the Pallas preparation backward built in, so PREP_BWD = "xla"
    # takes the two-VJP path (read here, when the forward is traced)
    if fused_prep and FUSED_VJP and PREP_BWD == "pallas" and variant == "gpu":
        o, st = _fused(q, k, v, g, bt, s0, cfg)
    else:
        w, ut, p, gcl = (prep_pallas if fused_prep else prep_xla)(q, k, v, g, bt, c)
        o, st = chunk_recurrence(w, ut, q, k, p, gcl, prep.in_chunk_cumsum(g, c), s0, cfg)
    o = o[:, :t]
    st = st.reshape(b, h, kdim, vdim)
    return (o, st) if return_state else o
