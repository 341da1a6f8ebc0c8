"""Gated delta rule, chunkwise, on the Pallas recurrence (algebra: kernels/README.md).

Per chunk (parallel): A_ts = beta_t exp(G_t - G_s) k_t.k_s (s < t); the UT transform
(I + A) [W, Ut] = diag(beta) [K * gamma, V]; P, G_C. Then the sequential kernel forms
Qg, Kd (from q, k and the in-chunk cumulative decay G) and U = Ut - W S per chunk.

GPU: the preparation is two Pallas kernels (kernels.pallas.gdn_prep), and one custom VJP
spans preparation and recurrence, so its backward hands the recurrence's dq, dk and dG
to the preparation-backward kernel (kernels.pallas.gdn_prep_bwd), which adds them to its
own before writing: no separate XLA sums of the two paths' cotangents. TPU (and
fused_prep=False): the preparation is the XLA form below (batched matmuls and a
triangular solve), differentiated by XLA, then the recurrence's own custom VJP.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernels.pallas import common, documents, plan, prep, recurrence
from kernels.pallas.gdn_prep import gdn_prep
from kernels.pallas.gdn_prep_bwd import gdn_prep_bwd
from kernels.pallas.plan import Config
from kernels.pallas.tuning import DEFAULT, Tuning


def prep_xla(q, k, v, g, beta, chunk, prep_docs=None):
    """q, k, v (B,Tp,H,.) input dtype; g, beta (B,Tp,H) float32. Returns the recurrence
    inputs (w, ut, p) as (B*H, Tp, .) in the input dtype and gcl (B*H, N, 1, 1).
    prep_docs: as gdn_prep's documents, None or (runs (B,Tp), masked G (B,Tp,H)) of
    packed documents (kernels.pallas.documents)."""
    b, tp, h, kdim = q.shape
    c = chunk
    n = tp // c
    dtype = q.dtype
    qc, kc, vc = (prep.chunked(x, b, h, n, c) for x in (q, k, v))
    gc, betac = prep.chunked(g, b, h, n, c), prep.chunked(beta, b, h, n, c)
    big_g, dmat, incl = prep.decay_terms(gc)
    gamma = jnp.exp(big_g)
    if prep_docs is not None:
        runs, gam = prep_docs
        dmat = jnp.where(documents.same_run(runs.reshape(b, 1, n, c)), dmat, 0.0)
        gamma = jnp.exp(prep.chunked(gam, b, h, n, c))
    p, gcl = prep.intra_chunk(qc, kc, dmat, big_g, dtype)
    strict = incl & ~jnp.eye(c, dtype=bool)
    kk = prep.einsum("bhntd,bhnsd->bhnts", kc, kc, dtype=dtype)
    a = jnp.where(strict, betac[..., :, None] * dmat * kk, 0.0)
    rhs = betac[..., None] * jnp.concatenate(
        [kc.astype(jnp.float32) * gamma[..., None], vc.astype(jnp.float32)], -1)
    x = lax.linalg.triangular_solve(a + jnp.eye(c, dtype=jnp.float32), rhs,
                                    left_side=True, lower=True, unit_diagonal=True)
    w, ut = x[..., :kdim], x[..., kdim:]
    return (*(prep.flat(t.astype(dtype)) for t in (w, ut, p)),
            gcl.reshape(b * h, n, 1, 1))


def _masked(big_g, docs, chunk):
    """The recurrence's (gcl, gam, gkey) for packed documents: the masked log weights
    (kernels.pallas.documents), or None without documents."""
    if docs is None:
        return None
    gam, gkey, gcl = documents.masked_weights(big_g, *docs, chunk)
    return gcl, gam, gkey


def _prepare(q, k, v, g, beta, docs, cfg: Config, *, fused: bool, with_inverse=False):
    """(G, [X] (the fused preparation's saved inverse, with_inverse only), the
    recurrence's inputs before its state: (w, ut, q, k, p, gcl, gam, gkey)). Without
    documents gam is G and gcl the preparation's G_C (gkey None: formed in the kernel);
    for packed documents the masked log weights, computed once for both the preparation
    (its W's gamma) and the recurrence. fused: the Pallas preparation (gdn_prep), else
    the XLA one."""
    big_g = prep.in_chunk_cumsum(g, cfg.chunk)
    masked = _masked(big_g, docs, cfg.chunk)
    prep_docs = None if masked is None else (docs[0], masked[1])
    if fused:
        w, ut, p, gcl, *saved = gdn_prep(q, k, v, big_g, beta, chunk=cfg.chunk,
                                         tuning=cfg.tuning, with_inverse=with_inverse,
                                         documents=prep_docs)
    else:
        (w, ut, p, gcl), saved = prep_xla(q, k, v, g, beta, cfg.chunk, prep_docs), []
    gcl, gam, gkey = (gcl, big_g, None) if masked is None else masked
    return big_g, saved, (w, ut, q, k, p, gcl, gam, gkey)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _fused(q, k, v, g, beta, s0, docs, bounds, cfg: Config):
    _, _, inputs = _prepare(q, k, v, g, beta, docs, cfg, fused=True)
    o, st = recurrence.chunk_recurrence(*inputs, s0, bounds, cfg)
    return o, st


def _fused_fwd(q, k, v, g, beta, s0, docs, bounds, cfg):
    big_g, (inverse,), inputs = _prepare(q, k, v, g, beta, docs, cfg, fused=True,
                                         with_inverse=True)
    (o, st), res = recurrence.forward_with_residuals(*inputs, s0, bounds, cfg)
    return (o, st), (v, beta, inverse, big_g, docs, res)


def _fused_bwd(cfg, saved, cts):
    v, beta, inverse, big_g, docs, res = saved
    _, _, q, k, _, _, gam, _, _, _, _ = res
    dw, dut, dq, dk, dp, dgcl, dgam, dgkey, ds0 = recurrence.backward(cfg, res, cts)
    if docs is None:
        prep_docs = None
    else:
        # the masked weights' cotangents back to G; the preparation's own G_C output is
        # not what the recurrence read, so its cotangent is 0
        _, pull = jax.vjp(lambda x: _masked(x, docs, cfg.chunk), big_g)
        (dgam,) = pull((dgcl, dgam, dgkey))
        dgcl = jnp.zeros_like(dgcl)
        prep_docs = (docs[0], gam)
    dq, dk, dv, dbig_g, dbeta = gdn_prep_bwd(q, k, v, big_g, beta, inverse, dw, dut, dp,
                                             dgcl, chunk=cfg.chunk, tuning=cfg.tuning,
                                             add=(dq, dk, dgam), documents=prep_docs)
    # G = in-chunk cumsum of g, so dg is the reverse in-chunk cumsum of dG
    dg = prep.in_chunk_cumsum(dbig_g, cfg.chunk, reverse=True)
    return (dq, dk, dv, dg, dbeta, ds0, None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


def gated_delta_rule(q, k, v, log_alpha, beta, *, initial_state=None, return_state=False,
                     chunk_size=64, segment_ids=None, variant=None, fused_prep=None,
                     tuning: Tuning = DEFAULT):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T ; o_t = S_t^T q_t.

    q, k: (B,T,H,K); v: (B,T,H,V); log_alpha, beta: (B,T,H). State (B,H,K,V) float32.
    Returns o (B,T,H,V) in the input dtype, or (o, state) with return_state=True.
    segment_ids: None or (B,T) ints; the state restarts where the id changes, and an
    initial state belongs to the first run only (kernels.pallas.documents).
    fused_prep: the Pallas preparation in one custom VJP with the recurrence (the
    default on the "gpu" variant; the only variant it runs on); False: the XLA
    preparation. tuning: the GPU programs' launch settings (kernels.pallas.tuning).
    """
    op = "kernels.pallas.gated_delta_rule"
    variant, dtype = common.check_inputs(op, q, k, v, segment_ids=segment_ids,
                                         chunk_size=chunk_size, variant=variant)
    b, t, h, kdim = q.shape
    vdim = v.shape[-1]
    if fused_prep is None:
        fused_prep = variant == "gpu"
    if fused_prep and variant != "gpu":
        raise ValueError(f"{op}: fused_prep runs only on the 'gpu' variant, "
                         f"got {variant!r}")
    c = chunk_size
    n = -(-t // c)
    tp = n * c
    q, k, v = (common.pad_time(x.astype(dtype), tp) for x in (q, k, v))
    g = common.pad_time(jnp.asarray(log_alpha, jnp.float32), tp)
    bt = common.pad_time(jnp.asarray(beta, jnp.float32), tp)

    s0 = (jnp.zeros((b, h, kdim, vdim), jnp.float32) if initial_state is None
          else jnp.asarray(initial_state, jnp.float32)).reshape(b * h, kdim, vdim)
    docs = (None if segment_ids is None
            else documents.chunk_runs(segment_ids, b, t, tp, c))
    cfg, bounds = plan.configure(c, variant, dtype, kdim, vdim, b, h, n, docs, tuning)
    if fused_prep:
        o, st = _fused(q, k, v, g, bt, s0, docs, bounds, cfg)
    else:
        _, _, inputs = _prepare(q, k, v, g, bt, docs, cfg, fused=False)
        o, st = recurrence.chunk_recurrence(*inputs, s0, bounds, cfg)
    o = o[:, :t]
    st = st.reshape(b, h, kdim, vdim)
    return (o, st) if return_state else o
