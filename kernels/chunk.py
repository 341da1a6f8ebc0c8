"""Chunkwise forms of decayed linear attention and the gated delta rule (pure JAX).

The algebra is in the design notes (CHUNKWISE): within a chunk of C tokens, with
L[t, s] = sum of log-decays in (s, t] and G_t = sum up to t,

  linear attention:  O = (Q * e^G) S_0 + ((Q K^T) * e^L) V
                     S_C = e^{G_C} S_0 + (K * e^{G_C - G})^T V
  gated delta rule:  (I + A) U = diag(beta) (V - (K * e^G) S_0),
                     A[t, s] = beta_t e^{L[t,s]} k_t.k_s  (s < t)
                     O = (Q * e^G) S_0 + ((Q K^T) * e^L) U,  S_C as above with U for V.

Segments: a "run" index per token (kernels.common.run_ids). Pairs (t, s) in different runs
are masked out of L; S_0 reaches only tokens still in the run that was open before the
chunk; S_C keeps S_0 only if the chunk's last token is still in that run.

`*_chunk_body` handles one chunk for all (batch, head) at once; the "parallel" forms call it
once on the whole sequence (C = T), the "chunk" forms scan it over chunks with
`jax.checkpoint`, so the backward pass stores only the states at chunk boundaries.
All arrays here are head-major, (B, H, C, dim), float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.common import einsum, masked_exp, segsum, suffix_sum_exclusive


def _masks(run, prev_run, g):
    """Masks and log-decay sums for one chunk.

    run: (B, C) run index per token; prev_run: (B,) run open before the chunk.
    Returns same-run causal mask (B,1,C,C) incl. diagonal, the decay matrix exp(L) masked,
    the S_0 weights exp(G_t) (B,H,C), the S_C weights for the keys (B,H,C) and exp(G_C) (B,H).
    """
    c = run.shape[-1]
    causal = jnp.tril(jnp.ones((c, c), bool))
    same = (run[:, :, None] == run[:, None, :]) & causal  # (B, C, C)
    same = same[:, None]  # broadcast over heads
    decay = masked_exp(same, segsum(g))  # (B,H,C,C), exp(L) on same-run causal pairs

    from_state = (run == prev_run[:, None])[:, None, :]  # (B,1,C): token still in S_0's run
    g_incl = jnp.cumsum(g, axis=-1)
    gamma = masked_exp(from_state, g_incl)  # (B,H,C)

    in_last = (run == run[:, -1:])[:, None, :]  # (B,1,C): token in the run open at the end
    key_weight = masked_exp(in_last, suffix_sum_exclusive(g))  # exp(G_C - G_s)
    gamma_end = masked_exp(from_state[..., -1], g_incl[..., -1])  # (B,H)
    return same, decay, gamma, key_weight, gamma_end


def linear_attention_chunk_body(state, prev_run, q, k, v, g, run):
    """One chunk of decayed linear attention. state (B,H,F,Dv) -> (o (B,H,C,Dv), new state).

    The normaliser is handled by the caller by appending a column of ones to v.
    """
    _, decay, gamma, key_weight, gamma_end = _masks(run, prev_run, g)
    scores = einsum("bhtf,bhsf->bhts", q, k) * decay
    o = einsum("bhtf,bhfd->bhtd", q * gamma[..., None], state)
    o = o + einsum("bhts,bhsd->bhtd", scores, v)
    new_state = gamma_end[..., None, None] * state + einsum(
        "bhsf,bhsd->bhfd", k * key_weight[..., None], v)
    return o, new_state


def _solve_unit_lower(a, rhs):
    """Solve (I + a) x = rhs, a strictly lower triangular (..., C, C), in float32.

    Forward substitution (LAPACK/cuBLAS trsm); its transpose rule gives the backward pass.
    """
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    return jax.scipy.linalg.solve_triangular(eye + a, rhs, lower=True, unit_diagonal=True)


def gated_delta_chunk_body(state, prev_run, q, k, v, g, beta, run):
    """One chunk of the gated delta rule via the WY / UT transform.

    state (B,H,K,V) -> (o (B,H,C,V), new state).
    """
    same, decay, gamma, key_weight, gamma_end = _masks(run, prev_run, g)
    c = run.shape[-1]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    kk = einsum("bhtf,bhsf->bhts", k, k)
    a = jnp.where(strict, beta[..., :, None] * decay * kk, 0.0)
    # T = (I + A)^-1 diag(beta): U~ = T V and W = T (K * gamma) in one solve.
    rhs = beta[..., None] * jnp.concatenate([v, k * gamma[..., None]], axis=-1)
    sol = _solve_unit_lower(a, rhs)
    dv = v.shape[-1]
    u = sol[..., :dv] - einsum("bhtf,bhfd->bhtd", sol[..., dv:], state)

    scores = einsum("bhtf,bhsf->bhts", q, k) * decay
    o = einsum("bhtf,bhfd->bhtd", q * gamma[..., None], state)
    o = o + einsum("bhts,bhsd->bhtd", scores, u)
    new_state = gamma_end[..., None, None] * state + einsum(
        "bhsf,bhsd->bhfd", k * key_weight[..., None], u)
    return o, new_state


def _pad_time(x, pad, axis=2, mode="constant"):
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, mode=mode)


def _scan_chunks(body, state, run, per_token, chunk_size):
    """Run `body(state, prev_run, *per_token_chunk, run_chunk)` over chunks of the time axis.

    per_token: head-major arrays (B, H, T, ...). The tail is padded to a whole chunk with
    tokens that change nothing: zero keys/values/beta, log-decay 0, and the last run index
    (so the final state is the state after the last real token).
    """
    b, t = run.shape
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t
    padded = [_pad_time(x, pad) for x in per_token]
    run_p = _pad_time(run, pad, axis=1, mode="edge")

    def split(x, axis):  # (..., n*c, ...) -> (n, ..., c, ...)
        shape = x.shape[:axis] + (n, c) + x.shape[axis + 1:]
        return jnp.moveaxis(x.reshape(shape), axis, 0)

    xs = [split(x, 2) for x in padded] + [split(run_p, 1)]

    @jax.checkpoint
    def step(carry, chunk):
        s, prev_run = carry
        o, s = body(s, prev_run, *chunk)
        return (s, chunk[-1][:, -1]), o

    prev_run = jnp.zeros((b,), run.dtype)  # run 0 is the one an initial state belongs to
    (state, _), o = jax.lax.scan(step, (state, prev_run), xs)
    o = jnp.moveaxis(o, 0, 2)  # (B, H, n, c, D)
    o = o.reshape(o.shape[:2] + (n * c,) + o.shape[4:])[:, :, :t]
    return o, state


def linear_attention_chunk(q, k, v, g, run, state, chunk_size):
    """Head-major float32 inputs; returns (o (B,H,T,Dv), final state)."""
    return _scan_chunks(linear_attention_chunk_body, state, run, [q, k, v, g], chunk_size)


def gated_delta_chunk(q, k, v, g, beta, run, state, chunk_size):
    return _scan_chunks(gated_delta_chunk_body, state, run, [q, k, v, g, beta], chunk_size)


def linear_attention_parallel(q, k, v, g, run, state):
    """Masked quadratic form: the chunk body on the whole sequence as one chunk."""
    prev_run = jnp.zeros((run.shape[0],), run.dtype)
    return linear_attention_chunk_body(state, prev_run, q, k, v, g, run)


def gated_delta_parallel(q, k, v, g, beta, run, state):
    """Quadratic form: one T x T triangular solve for the whole sequence."""
    prev_run = jnp.zeros((run.shape[0],), run.dtype)
    return gated_delta_chunk_body(state, prev_run, q, k, v, g, beta, run)
