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
