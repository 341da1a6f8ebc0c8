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


def _normaliser(key_sums, dot_q, p, gcl, z0):
    """den (B,H,N,C) = q_t . z_t and the final z. key_sums (B,H,N,K) f32: each chunk's
    sum of its (decay-weighted) keys; dot_q(z (B,H,N,K)) -> (B,H,N,C): each token's
    (weighted) query dotted with its chunk's z; p (B,H,N,C,C); gcl (B,H,N); z0 (B,H,K)."""
    decay = jnp.exp(gcl)[..., None]                     # (B,H,N,1)

    def combine(x, y):  # apply chunk x, then chunk y
        return x[0] * y[0], y[0] * x[1] + y[1]

    mul, off = lax.associative_scan(combine, (decay, key_sums), axis=2)
    z_end = mul * z0[:, :, None, :] + off               # z after each chunk
    z_start = jnp.concatenate([z0[:, :, None, :], z_end[:, :, :-1]], axis=2)
    return dot_q(z_start) + jnp.sum(p, axis=-1), z_end[:, :, -1]


def _chunk_normaliser_inputs(qg, kd):
    """_normaliser's key sums and query product from (B,H,N,C,K) f32 weighted q, k."""
    return jnp.sum(kd, axis=-2), lambda z: jnp.einsum(
        "bhncf,bhnf->bhnc", qg, z, precision=lax.Precision.HIGHEST)


def _time_normaliser_inputs(q, k, log_wq, log_wk, b, h, n, c):
    """The same from q, k in their (B,Tp,H,K) layout (split into chunks by a reshape, no
    transpose) and optional (B,Tp,H) log weights of each."""
    def chunks(x, log_w):
        x = x.reshape(b, n, c, h, x.shape[-1]).astype(jnp.float32)
        return x if log_w is None else x * jnp.exp(log_w.reshape(b, n, c, h))[..., None]
    qn, kn = chunks(q, log_wq), chunks(k, log_wk)
    return jnp.moveaxis(jnp.sum(kn, axis=2), 2, 1), lambda z: jnp.einsum(
        "bnchf,bhnf->bhnc", qn, z, precision=lax.Precision.HIGHEST)


def _taylor_scores(taylor_qk, b, h, n, c, tp, dtype):
    """In-chunk products of Taylor features from the inputs they are made of:
    phi(x) . phi(y) = 1 + s + s^2 / 2 with s = x . y (models.feature_maps.taylor), float32
    (B,H,N,C,C). Padded rows give 1, not 0: they are keys only of padded queries."""
    xq, xk = (prep.chunked(common.pad_time(x.astype(dtype), tp), b, h, n, c)
              for x in taylor_qk)
    s = prep.einsum("bhntd,bhnsd->bhnts", xq, xk, dtype=dtype)
    return 1.0 + s + 0.5 * s * s


def linear_attention(q, k, v, *, normalize=True, eps=1e-6, log_decay=None,
                     initial_state=None, return_state=False, chunk_size=64,
                     segment_ids=None, variant=None, tuning: Tuning = DEFAULT,
                     taylor_qk=None):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, z_t = exp(g_t) z_{t-1} + k_t,
    o_t = S_t^T q_t / (z_t^T q_t + eps) (normalize) or S_t^T q_t.

    q, k: (B,T,H,F); v: (B,T,H,Dv); log_decay: None | (H,) | (B,T,H).
    segment_ids: None or (B,T) ints; the state (and z) restarts where the id changes, and
    an initial state belongs to the first run only (kernels.pallas.documents).
    State S (B,H,F,Dv) float32, or (S, z) with z (B,H,F) when normalize=True.
    tuning: the GPU programs' launch settings (kernels.pallas.tuning).
    taylor_qk: None, or (x_q, x_k) (B,T,H,d) when q, k are their Taylor features
    (models.feature_maps.taylor or taylor_symmetric, zero-padded), no decay: the in-chunk
    scores are then formed from the d-wide inputs and the normaliser from q, k as given,
    so the F-wide features are read only in the kernel's (B,T,H,F) layout, never
    rewritten into chunks (Based: F = 256 against d = 16).
    """
    op = "kernels.pallas.linear_attention"
    if taylor_qk is not None and log_decay is not None:
        raise ValueError(f"{op}: taylor_qk is for undecayed Taylor features (Based); "
                         f"got a log_decay")
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
        scores = (prep.einsum("bhntd,bhnsd->bhnts", qc, kc, dtype=dtype)
                  if taylor_qk is None else _taylor_scores(taylor_qk, b, h, n, c, tp, dtype))
        p = scores * mask
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
        if taylor_qk is None:
            p, gcl = prep.intra_chunk(qc, kc, dmat, gc, dtype)
        else:
            p, gcl = _taylor_scores(taylor_qk, b, h, n, c, tp, dtype) * dmat, gc[..., -1]
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
        if taylor_qk is not None:  # no decay; gam and gkey mask packed documents
            sums = _time_normaliser_inputs(q, k, gam, gkey, b, h, n, c)
        elif gam is None:
            sums = _chunk_normaliser_inputs(qc.astype(jnp.float32), kc.astype(jnp.float32))
        elif gkey is None:
            sums = _chunk_normaliser_inputs(*prep.decayed(qc, kc, gc))
        else:   # the masked weights (packed documents)
            weight = lambda lg, x: x.astype(jnp.float32) * jnp.exp(  # noqa: E731
                prep.chunked(lg, b, h, n, c))[..., None]
            sums = _chunk_normaliser_inputs(weight(gam, qc), weight(gkey, kc))
        den, z = _normaliser(*sums, p, gcl, z0)
        den = jnp.moveaxis(den.reshape(b, h, tp), 1, 2)            # (B, Tp, H)
        o = (o / (den[..., None] + eps))[:, :t].astype(dtype)
        state = (st, z)
    else:
        o = o[:, :t]
        state = st
    return (o, state) if return_state else o
