"""Packed documents in the chunkwise kernels: masks from per-token run indices.

A run is a stretch of equal segment ids (kernels.common.run_ids): the state restarts at
each run's first token, and an initial state belongs to run 0 only. Within a chunk of C
tokens with the in-chunk cumulative log-decay G, the chunkwise algebra
(kernels/chunk.py, CHUNKWISE) then masks

    D_ts = exp(G_t - G_s)      only for s, t in the same run (the intra-chunk terms)
    exp(G_t)                   only for tokens still in the run open before the chunk
                               (the incoming state's weight: Q's and, for the delta rule,
                               W's)
    exp(G_C - G_s)             only for tokens in the chunk's last run (what reaches the
                               next chunk's state)
    exp(G_C)                   only if the last token is still in the incoming run

so a boundary may fall anywhere: at a chunk start, inside a chunk or inside a 16-row
block, with nothing stored per token beyond the run index. The masked weights enter the
recurrence as logs with -inf where masked (exp(-inf) = 0 exactly; no difference of two
masked values is ever formed), and their gradients pass back through jnp.where.

Per-token ids rather than offsets (fla's cu_seqlens): every batch here already carries
per-token segment ids (data packing, one (B, T) array that jit shards like the tokens),
a static shape, and the masks need only comparisons of neighbouring ids; offsets would
need a host-side count of documents, a shape that changes with the data.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from kernels.common import pad_axis, run_ids


def chunk_runs(segment_ids, b: int, t: int, tp: int, chunk: int):
    """(runs (B, Tp) int32, prev_run (B, N) int32): each token's run index (padded steps
    continue the last run: they are identities) and the run open before each chunk (0
    before the first: the initial state's)."""
    runs = pad_axis(run_ids(segment_ids, b, t), tp, 1, mode="edge")
    before = runs[:, chunk - 1:-1:chunk]                       # last token of chunks 0..N-2
    prev_run = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), before], axis=1)
    return runs, prev_run


def masked_weights(big_g, runs, prev_run, chunk: int):
    """The recurrence's masked log weights from G (B, Tp, H) float32, the in-chunk
    inclusive cumsum of the log-decays:
      gam  (B, Tp, H): G_t where token t is in the chunk's incoming run, else -inf;
      gkey (B, Tp, H): G_C - G_t where t is in the chunk's last run, else -inf;
      gcl  (B*H, N, 1, 1): G_C where the last token is in the incoming run, else -inf.
    """
    b, tp, h = big_g.shape
    n = tp // chunk
    g = big_g.reshape(b, n, chunk, h)
    r = runs.reshape(b, n, chunk)[..., None]                   # (B, N, C, 1)
    from_state = r == prev_run[:, :, None, None]
    in_last = r == r[:, :, -1:]
    g_end = g[:, :, -1:]
    neg_inf = jnp.float32(-jnp.inf)
    gam = jnp.where(from_state, g, neg_inf).reshape(b, tp, h)
    gkey = jnp.where(in_last, g_end - g, neg_inf).reshape(b, tp, h)
    gcl = jnp.where(from_state[:, :, -1], g_end[:, :, 0], neg_inf)       # (B, N, H)
    return gam, gkey, jnp.transpose(gcl, (0, 2, 1)).reshape(b * h, n, 1, 1)


def same_run(runs_c):
    """(..., C, C) bool: tokens t, s of a chunk in the same run; runs_c (..., C)."""
    return runs_c[..., :, None] == runs_c[..., None, :]


def piece_bounds(runs, chunk: int, pieces: int, piece_chunks: int):
    """(B, Q) int32, Q the next power of two >= pieces + 1: where each piece of a row's
    sequential walk starts, b_0 = 0, b_p the chunk holding the start of the document that
    contains token p * piece_chunks * chunk (0 < p < pieces), b_pieces = N - 1, padded
    with N - 1. runs: (B, Tp) run indices (nondecreasing).

    Why a walk from b_p may start from a zero state: b_p > 0 holds a document start, so
    the state after chunk b_p does not depend on the state before it (its decay and
    every incoming-run key weight are masked), and the outputs, U and state of the
    chunk's tokens after that start do not either. Forward, piece p walks b_p..b_{p+1}
    and writes chunks (b_p, b_{p+1}] ([0, b_1] for p = 0), so the chunk b_p (whose
    first tokens belong to the previous document) is written by the piece that carried
    the real state into it; backward (dS, last chunk first), piece p walks b_{p+1}..b_p
    and writes [b_p, b_{p+1}) ([b_last, N - 1] for the last piece): a chunk holding a
    document start passes nothing of dS' back to the chunk before it. The pieces' write
    ranges partition the chunks, whatever the documents; a row of one document gives
    one piece the whole walk (today's cost) and the others one chunk each.
    """
    b, tp = runs.shape
    n = tp // chunk
    size = 1
    while size < pieces + 1:
        size *= 2
    index = jnp.arange(tp, dtype=jnp.int32)
    changed = jnp.concatenate([jnp.zeros((b, 1), bool), runs[:, 1:] != runs[:, :-1]], 1)
    doc_start = lax.cummax(jnp.where(changed, index, 0), axis=1)       # (B, Tp)
    first = jnp.minimum(jnp.arange(1, pieces) * piece_chunks * chunk, tp - 1)
    inner = doc_start[:, first] // chunk                               # (B, pieces - 1)
    return jnp.concatenate([jnp.zeros((b, 1), jnp.int32), inner.astype(jnp.int32),
                            jnp.full((b, size - pieces), n - 1, jnp.int32)], axis=1)
