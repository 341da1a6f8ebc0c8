"""Chunkwise forms of decayed linear attention and the gated delta rule (pure JAX).

The algebra is in the design notes (CHUNKWISE): within a chunk of C tokens, with
L[t, s] = sum of log-decays in (s, t] and G_t = sum up to t,

  linear attention:  O = (Q * e^G) S_0 + ((Q K^T) * e^L) V
                     S_C = e^{G_C} S_0 + (K * e^{G_C - G})^T V
  gated delta rule:  (I + A) [U~, W] = diag(beta) [V, K * e^G],
                     A[t, s] = beta_t e^{L[t,s]} k_t.k_s  (s < t),   U = U~ - W S_0
                     O = (Q * e^G) S_0 + ((Q K^T) * e^L) U,  S_C as above with U for V.

Three phases, so that only the small state recurrence runs sequentially:
  1. prepare (all chunks at once): decay factors, and for the delta rule the UT transform
     (a triangular solve per chunk) giving U~ and W;
  2. a lax.scan over chunks carrying the float32 state S (C x F x Dv work per step),
     emitting the state entering each chunk (and U for the delta rule);
  3. outputs (all chunks at once) from those states.
Phases 1 and 3 are wrapped in jax.checkpoint: the backward pass keeps their inputs and the
chunk-boundary states, never a per-token state or the C x C decay/score matrices, and
recomputes the rest chunk-parallel.

Segments: a "run" index per token (kernels.common.run_ids). Pairs (t, s) in different runs
are masked out of L; S_0 reaches only tokens still in the run that was open before the
chunk; S_C keeps S_0 only if the chunk's last token is still in that run.

Arrays here are head-major and chunked, (B, H, N, C, dim), in the compute dtype (float32).
The "parallel" forms are the same code with one chunk holding the whole sequence.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.common import einsum, masked_exp, pad_axis, segsum, suffix_sum_exclusive


# ----------------------------------------------------------------------------- geometry

def _decay_terms(g, run, prev_run, dtype=jnp.float32):
    """Decay factors of every chunk.

    g: (B,H,N,C) log-decays, or None for no decay; run: (B,N,C) run index; prev_run: (B,N)
    run open before the chunk. Returns
      decay (B,H,N,C,C): e^{L[t,s]} on same-run pairs s <= t, else 0;
      gamma (B,H,N,C): e^{G_t} for tokens still in S_0's run, else 0 (weight of S_0);
      key_weight (B,H,N,C): e^{G_C - G_s} for tokens in the chunk's last run, else 0;
      gamma_end (B,H,N): e^{G_C} if the last token is still in S_0's run, else 0.
    With g None the same masks as 0/1 in dtype, with a head axis of 1 (they broadcast):
    no cumsum or exp of zeros for XLA to constant-fold at great cost on long sequences.
    """
    c = run.shape[-1]
    causal = jnp.tril(jnp.ones((c, c), bool))
    same = (run[..., :, None] == run[..., None, :]) & causal  # (B,N,C,C)
    from_state = (run == prev_run[..., None])[:, None]  # (B,1,N,C)
    in_last = (run == run[..., -1:])[:, None]
    if g is None:
        return tuple(m.astype(dtype) for m in (same[:, None], from_state, in_last,
                                               from_state[..., -1]))
    decay = masked_exp(same[:, None], segsum(g))

    g_incl = jnp.cumsum(g, axis=-1)
    gamma = masked_exp(from_state, g_incl)
    key_weight = masked_exp(in_last, suffix_sum_exclusive(g))
    gamma_end = masked_exp(from_state[..., -1], g_incl[..., -1])
    return decay, gamma, key_weight, gamma_end


def _substitute(a, rhs, *, reverse: bool):
    """x with x_i = rhs_i - a[i, :] x, row by row (forward, or backward when reverse).

    a must be zero wherever row i would read a row not yet solved (strictly lower for the
    forward order, strictly upper for the reverse one). Plain XLA ops rather than LAPACK's
    trsm: on small CPU machines XLA's thread pool can deadlock inside that custom call.
    """
    c = a.shape[-1]

    def row(step, x):
        i = c - 1 - step if reverse else step
        xi = rhs[..., i, :] - einsum("...j,...jd->...d", a[..., i, :], x)
        return x.at[..., i, :].set(xi)
    return jax.lax.fori_loop(0, c, row, rhs)


@jax.custom_vjp
def _solve_unit_lower(a, rhs):
    """Solve (I + a) x = rhs for strictly lower triangular a (..., C, C), in float32."""
    return _substitute(a, rhs, reverse=False)


def _solve_unit_lower_fwd(a, rhs):
    x = _solve_unit_lower(a, rhs)
    return x, (a, x)


def _solve_unit_lower_bwd(res, dx):
    # x = (I + a)^-1 rhs  =>  d_rhs = (I + a)^-T dx,  d_a = -strict_lower(d_rhs x^T).
    a, x = res
    d_rhs = _substitute(jnp.swapaxes(a, -1, -2), dx, reverse=True)
    c = a.shape[-1]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    d_a = jnp.where(strict, -einsum("...id,...jd->...ij", d_rhs, x), 0.0)
    return d_a, d_rhs


_solve_unit_lower.defvjp(_solve_unit_lower_fwd, _solve_unit_lower_bwd)


# ----------------------------------------------------------------------------- phases

@jax.checkpoint
def _linear_prepare(k, v, g, run, prev_run):
    """Each chunk's own contribution to the state, (K * e^{G_C - G})^T V, and e^{G_C}."""
    _, _, key_weight, gamma_end = _decay_terms(g, run, prev_run, k.dtype)
    write = einsum("bhncf,bhncd->bhnfd", k * key_weight[..., None], v)
    return write, gamma_end


@jax.checkpoint
def _delta_prepare(k, v, g, beta, run, prev_run):
    """The UT transform of every chunk: U~ = T V, W = T (K * e^G), T = (I + A)^-1 diag(beta);
    plus the key weights for the state update."""
    decay, gamma, key_weight, gamma_end = _decay_terms(g, run, prev_run)
    c = run.shape[-1]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    kk = einsum("bhntf,bhnsf->bhnts", k, k)
    a = jnp.where(strict, beta[..., :, None] * decay * kk, 0.0)
    rhs = beta[..., None] * jnp.concatenate([v, k * gamma[..., None]], axis=-1)
    sol = _solve_unit_lower(a, rhs)
    dv = v.shape[-1]
    return sol[..., :dv], sol[..., dv:], k * key_weight[..., None], gamma_end


@jax.checkpoint
def _outputs(q, k, values, g, run, prev_run, states):
    """O = (Q * e^G) S_0 + ((Q K^T) * e^L) values, for every chunk at once.

    states: (B,H,N,F,Dv), the state entering each chunk."""
    decay, gamma, _, _ = _decay_terms(g, run, prev_run, q.dtype)
    scores = einsum("bhntf,bhnsf->bhnts", q, k) * decay
    o = einsum("bhntf,bhnfd->bhntd", q * gamma[..., None], states)
    return o + einsum("bhnts,bhnsd->bhntd", scores, values)


def _chunk_axis_first(x):
    return jnp.moveaxis(x, 2, 0)  # (B,H,N,...) -> (N,B,H,...)


def _chunk_axis_back(x):
    return jnp.moveaxis(x, 0, 2)


def _linear_states(state, write, gamma_end):
    """S_{n+1} = e^{G_C} S_n + write_n. Returns (states entering each chunk, final)."""

    @jax.checkpoint
    def step(s, x):
        w, ge = x
        return ge[..., None, None] * s + w, s

    final, states = jax.lax.scan(step, state, (_chunk_axis_first(write),
                                               _chunk_axis_first(gamma_end)))
    return _chunk_axis_back(states), final


def _delta_states(state, u_tilde, w, weighted_k, gamma_end):
    """U_n = U~_n - W_n S_n; S_{n+1} = e^{G_C} S_n + (K e^{G_C - G})^T U_n.

    Returns (states entering each chunk, U, final state)."""

    @jax.checkpoint
    def step(s, x):
        ut, w_n, kw, ge = x
        u = ut - einsum("bhtf,bhfd->bhtd", w_n, s)
        new = ge[..., None, None] * s + einsum("bhsf,bhsd->bhfd", kw, u)
        return new, (s, u)

    xs = tuple(_chunk_axis_first(x) for x in (u_tilde, w, weighted_k, gamma_end))
    final, (states, u) = jax.lax.scan(step, state, xs)
    return _chunk_axis_back(states), _chunk_axis_back(u), final


# ----------------------------------------------------------------------------- layout

def _pad_split(x, axis, pieces, size, mode="constant"):
    """Pad axis `axis` of x to pieces * size and split it into (pieces, size)."""
    x = pad_axis(x, pieces * size, axis, mode)
    return x.reshape(x.shape[:axis] + (pieces, size) + x.shape[axis + 1:])


def _to_chunks(per_token, run, chunk_size):
    """Pad the time axis to whole chunks and split it: (B,H,T,...) -> (B,H,N,C,...).

    Padding tokens change nothing: zero keys/values/beta, log-decay 0, and the last run
    index, so the final state is the state after the last real token. Also returns the run
    open before each chunk, (B,N): run 0 (the one an initial state belongs to) for chunk 0.
    """
    b, t = run.shape
    c = min(chunk_size, t)
    n = -(-t // c)
    chunks = [None if x is None else _pad_split(x, 2, n, c) for x in per_token]
    run_c = _pad_split(run, 1, n, c, mode="edge")  # (B,N,C)
    prev_run = jnp.concatenate([jnp.zeros((b, 1), run.dtype), run_c[:, :-1, -1]], axis=1)
    return chunks, run_c, prev_run


def _from_chunks(o, t):
    """(B,H,N,C,D) -> (B,H,T,D)."""
    o = o.reshape(o.shape[:2] + (-1,) + o.shape[4:])
    return o[:, :, :t]


# ----------------------------------------------------------------------------- entry points

def linear_attention_chunk(q, k, v, g, run, state, chunk_size):
    """Head-major inputs (B,H,T,.), g (B,H,T) or None (no decay), run (B,T), state
    (B,H,F,Dv).

    Returns (o (B,H,T,Dv), final state). The normaliser is the caller's column of ones."""
    t = q.shape[2]
    (qc, kc, vc, gc), run_c, prev_run = _to_chunks([q, k, v, g], run, chunk_size)
    write, gamma_end = _linear_prepare(kc, vc, gc, run_c, prev_run)
    states, final = _linear_states(state, write, gamma_end)
    o = _outputs(qc, kc, vc, gc, run_c, prev_run, states)
    return _from_chunks(o, t), final


def gated_delta_chunk(q, k, v, g, beta, run, state, chunk_size):
    """Head-major inputs (B,H,T,.), g and beta (B,H,T), run (B,T), state (B,H,K,V)."""
    t = q.shape[2]
    (qc, kc, vc, gc, bc), run_c, prev_run = _to_chunks([q, k, v, g, beta], run, chunk_size)
    u_tilde, w, weighted_k, gamma_end = _delta_prepare(kc, vc, gc, bc, run_c, prev_run)
    states, u, final = _delta_states(state, u_tilde, w, weighted_k, gamma_end)
    o = _outputs(qc, kc, u, gc, run_c, prev_run, states)
    return _from_chunks(o, t), final


def linear_attention_parallel(q, k, v, g, run, state):
    """Masked quadratic form: the whole sequence as one chunk (T x T decay matrix)."""
    return linear_attention_chunk(q, k, v, g, run, state, q.shape[2])


def gated_delta_parallel(q, k, v, g, beta, run, state):
    """Quadratic form: one T x T triangular solve for the whole sequence."""
    return gated_delta_chunk(q, k, v, g, beta, run, state, q.shape[2])


# Past this many tokens the chunk forms run segment by segment (in_segments). They hold
# per-chunk tensors of the whole sequence (the (B,H,N,F,D) chunk-start states, the
# chunk-major copies of the inputs), several times its K x V state bytes per chunk: a
# Based prefill of B64 T32768 (then 273 Taylor features) asked the H200 for 354 GiB.
SEGMENT_TOKENS = 4096


def in_segments(chunk_form, per_token, run, state, segment):
    """chunk_form (linear_attention_chunk / gated_delta_chunk with the chunk size bound)
    run over `segment`-token pieces one after another (lax.scan carrying the state), so
    its per-chunk tensors exist for one segment at a time. Exact: each segment starts
    from the state the previous one ended in. per_token: the (B,H,T,...) inputs (None
    allowed), run (B,T). Padding tokens change nothing (zeros, the last run index).

    Run indices are made relative to the run open before each segment, so the carried
    state continues that run (index 0, the run an initial state belongs to) and a new
    run inside the segment starts from zero as in the whole-sequence form."""
    b, h, t = next(x for x in per_token if x is not None).shape[:3]
    n = -(-t // segment)

    def split(x, axis, mode="constant"):   # (..., T, ...) -> (N, ..., segment, ...)
        return jnp.moveaxis(_pad_split(x, axis, n, segment, mode), axis, 0)

    runs = split(run, 1, mode="edge")                                    # (N, B, seg)
    open_before = jnp.concatenate([jnp.zeros((1, b), run.dtype), runs[:-1, :, -1]], axis=0)
    xs = ([None if x is None else split(x, 2) for x in per_token],
          runs - open_before[..., None])

    def step(s, piece):
        inputs, r = piece
        o, s = chunk_form(*inputs, r, s)
        return s, o

    final, o = jax.lax.scan(step, state, xs)                             # o (N,B,H,seg,D)
    o = jnp.moveaxis(o, 0, 2).reshape(b, h, n * segment, o.shape[-1])
    return o[:, :, :t], final
