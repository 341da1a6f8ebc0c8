"""(Decayed, optionally normalised) linear attention on the Pallas recurrence.

Per chunk (parallel, XLA): P, G_C; the kernel carries S with U = V (no W) and forms
Qg, Kd itself from q, k and the in-chunk cumulative decay G (no decay: no exp at all).
The normaliser z is the same recurrence with a value column of ones; rather than widen
V by one column (breaking power-of-two tiles), its per-chunk sums go through an
associative scan over chunks here: (K,) vectors, cheap next to the (K, V) state.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from kernels.pallas import common, documents, plan, prep
from kernels.pallas.recurrence import chunk_recurrence
from kernels.pallas.tuning import DEFAULT, Tuning


def _normaliser(qg, kd, p, gcl, z0):
    """den (B,H,N,C) = q_t . z_t and the final z, from the chunk sums of Kd.
    qg, kd: (B,H,N,C,K) f32; p (B,H,N,C,C); gcl (B,H,N); z0 (B,H,K)."""
    decay = jnp.exp(gcl)[..., None]                     # (B,H,N,1)
    add = jnp.sum(kd, axis=-2)                          # (B,H,N,K)

    def combine(x, y):  # apply chunk x, then chunk y
        return x[0] * y[0], y[0] * x[1] + y[1]

    mul, off = lax.associative_scan(combine, (decay, add), axis=2)
    z_end = mul * z0[:, :, None, :] + off               # z after each chunk
    z_start = jnp.concatenate([z0[:, :, None, :], z_end[:, :, :-1]], axis=2)
    den = jnp.einsum("bhncf,bhnf->bhnc", qg, z_start,
                     precision=lax.Precision.HIGHEST) + jnp.sum(p, axis=-1)
    return den, z_end[:, :, -1]


def linear_attention(q, k, v, *, normalize=True, eps=1e-6, log_decay=None,
                     initial_state=None, return_state=False, chunk_size=64,
                     segment_ids=None, variant=None, tuning: Tuning = DEFAULT):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, z_t = exp(g_t) z_{t-1} + k_t,
    o_t = S_t^T q_t / (z_t^T q_t + eps) (normalize) or S_t^T q_t.

    q, k: (B,T,H,F); v: (B,T,H,Dv); log_decay: None | (H,) | (B,T,H).
    segment_ids: None or (B,T) ints; the state (and z) restarts where the id changes, and
    an initial state belongs to the first run only (kernels.pallas.documents).
    State S (B,H,F,Dv) float32, or (S, z) with z (B,H,F) when normalize=True.
    tuning: the GPU programs' launch settings (kernels.pallas.tuning).
    """
    op = "kernels.pallas.linear_attention"
    variant, dtype = common.check_inputs(op, q, k, v, segment_ids=segment_ids,
                                         chunk_size=chunk_size, variant=variant)
    b, t, h, f = q.shape
    dv = v.shape[-1]
    c = chunk_size
    n = -(-t // c)
    tp = n * c
    q, k, v = (common.pad_time(x.astype(dtype), tp) for x in (q, k, v))
    qc, kc, vc = (prep.chunked(x, b, h, n, c) for x in (q, k, v))
    gkey = None
    if log_decay is None and segment_ids is None:
        # No decay: G = 0. Spelled out rather than computed from zeros, which XLA would
        # constant-fold at great compile-time cost for long sequences.
        f32 = jnp.float32
        mask = jnp.tril(jnp.ones((c, c), f32))
        gam = None      # the log weight of the incoming state at each token
        p = prep.einsum("bhntd,bhnsd->bhnts", qc, kc, dtype=dtype) * mask
        gcl = jnp.zeros((b, h, n), f32)
    else:
        if log_decay is None:
            # Packed documents without decay: G = 0 and D = the causal mask, masked by
            # run below. Spelled out, not cumsums of zeros, for the reason above.
            gam = jnp.zeros((b, tp, h), jnp.float32)
            gc = jnp.zeros((b, h, n, c), jnp.float32)
            dmat = jnp.tril(jnp.ones((c, c), jnp.float32))
        else:
            g = jnp.asarray(log_decay, jnp.float32)
            if g.shape == (h,):
                g = jnp.broadcast_to(g, (b, t, h))
            elif g.shape != (b, t, h):
                raise ValueError(f"{op}: log_decay must be (heads,) or (batch, time, "
                                 f"heads) = {(b, t, h)}, got {g.shape}")
            g = common.pad_time(g, tp)
            gam = prep.in_chunk_cumsum(g, c)     # G; masked below for packed documents
            gc, dmat, _ = prep.decay_terms(prep.chunked(g, b, h, n, c))
        if segment_ids is not None:
            runs, prev_run = documents.chunk_runs(segment_ids, b, t, tp, c)
            dmat = jnp.where(documents.same_run(runs.reshape(b, 1, n, c)), dmat, 0.0)
            gam, gkey, gcl_masked = documents.masked_weights(gam, runs, prev_run, c)
        p, gcl = prep.intra_chunk(qc, kc, dmat, gc, dtype)
        if segment_ids is not None:
            gcl = gcl_masked.reshape(b, h, n)

    if normalize:
        if initial_state is None:
            s0, z0 = None, jnp.zeros((b, h, f), jnp.float32)
        else:
            s0, z0 = initial_state
            z0 = jnp.asarray(z0, jnp.float32)
    else:
        s0 = initial_state
    s0 = (jnp.zeros((b, h, f, dv), jnp.float32) if s0 is None
          else jnp.asarray(s0, jnp.float32))

    out_dtype = jnp.float32 if normalize else dtype
    cfg, bounds = plan.configure(c, variant, out_dtype, f, dv, b, h, n,
                                 None if segment_ids is None else (runs, prev_run), tuning)
    o, st = chunk_recurrence(None, prep.flat(vc), q, k, prep.flat(p.astype(dtype)),
                             gcl.reshape(b * h, n, 1, 1), gam, gkey,
                             s0.reshape(b * h, f, dv), bounds, cfg)
    st = st.reshape(b, h, f, dv)
    if normalize:
        if gam is None:
            qg, kd = qc.astype(jnp.float32), kc.astype(jnp.float32)
        elif gkey is None:
            qg, kd = prep.decayed(qc, kc, gc)
        else:   # the masked weights (packed documents)
            weight = lambda lg, x: x.astype(jnp.float32) * jnp.exp(  # noqa: E731
                prep.chunked(lg, b, h, n, c))[..., None]
            qg, kd = weight(gam, qc), weight(gkey, kc)
        den, z = _normaliser(qg, kd, p, gcl, z0)
        den = jnp.moveaxis(den.reshape(b, h, tp), 1, 2)            # (B, Tp, H)
        o = (o / (den[..., None] + eps))[:, :t].astype(dtype)
        state = (st, z)
    else:
        o = o[:, :t]
        state = st
    return (o, state) if return_state else o
