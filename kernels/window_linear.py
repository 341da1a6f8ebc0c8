"""LoLCATs' hybrid attention (Zhang et al. 2024, "LoLCATs", `hybrid_attention_quadratic`
in HazyResearch/lolcats' linear_window_attention_sw.py): exact softmax over the last
`window` keys and linear attention over every older key, under one normaliser,

    y_t = (sum_{s in W(t)} a_ts v_s + sum_{s <= t - w} phi(q_t).phi(k_s) v_s)
          / (sum_{s in W(t)} a_ts   + sum_{s <= t - w} phi(q_t).phi(k_s)),
    a_ts = gamma exp(q_t.k_s / sqrt(D) - m_t),  W(t) = {s : 0 <= t - s < w},

m_t the largest window score of row t and gamma in (0, 1) a learned factor per head
(sigmoid of `window_factors`; LoLCATs' linear factor is 1). The max stays in the formula,
as in the reference, so the balance between the two parts depends on it. Keys of another
packed document (a run of equal segment ids, as kernels.common.run_ids counts them, the
linear kernels' rule) take part in neither sum. With w >= T there are no linear terms
and y is softmax attention (gamma cancels), so a layer converted from a softmax layer
starts as that layer over its window.

Three exact forms, each q, k (B, T, H, D), phi(q), phi(k) (B, T, H, F), v (B, T, H, Dv):
  quadratic   the reference: masked (T, T) weights;
  blocked     the window from (w, 2w) blocks of scores, the linear part as causal linear
              attention (kernels.ops.linear_attention, so its chunk form or Pallas
              kernel) over keys and values delayed by w; under a `sequence` mesh the
              linear part runs split (kernels.context_parallel.linear_attention), the
              window blocks and the delay are left to XLA's partitioner (exact; no
              hand-written halo exchange yet);
  step        one token from a state of the last w keys and values and the linear state
              of the keys older than them (the decode form); `state_after` is the state
              a whole prompt from a fresh state leaves, so a prompt runs blocked.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import context_parallel
from kernels.common import masked_exp, run_ids, segmented_scan, visible_keys

_NEG = -1e30  # below any score: the max of a row that holds a kept key is that key's


def _window_weights(scores, keep, gamma):
    """gamma exp(score - the row's largest kept score) on the kept keys, 0 elsewhere
    (gamma broadcast against scores by the caller)."""
    m = jnp.max(jnp.where(keep, scores, _NEG), axis=-1, keepdims=True)
    return gamma * masked_exp(keep, scores - m)


def hybrid_weights(q, k, fq, fk, gamma, *, window: int, segment_ids=None):
    """The reference's attention weights (B, H, T, S) float32: the window's and the linear
    part's terms of each query over their common normaliser (rows sum to 1)."""
    b, t, _, d = q.shape
    f32 = jnp.float32
    scores = jnp.einsum("bthd,bshd->bhts", q.astype(f32), k.astype(f32)) * d ** -0.5
    seg = run_ids(segment_ids, b, t)
    in_window = visible_keys(t, seg, window)                       # (B, 1, T, S)
    in_linear = visible_keys(t, seg) & ~in_window
    # every row holds its own key, so its max is a real score
    a_sm = _window_weights(scores, in_window, gamma.astype(f32)[:, None, None])
    a_ln = jnp.where(in_linear, jnp.einsum("bthf,bshf->bhts", fq.astype(f32),
                                           fk.astype(f32)), 0.0)
    a = a_sm + a_ln
    return a / a.sum(-1, keepdims=True)


def hybrid_quadratic(q, k, fq, fk, v, gamma, *, window: int, segment_ids=None):
    """The reference form; gamma (H,) the window factor in (0, 1). Float32 inside."""
    a = hybrid_weights(q, k, fq, fk, gamma, window=window, segment_ids=segment_ids)
    return jnp.einsum("bhts,bshd->bthd", a, v.astype(jnp.float32)).astype(v.dtype)


def _window_terms(q, k, v, gamma, window: int, seg):
    """The window part from blocks: (numerator (B, T, H, Dv), denominator (B, T, H)),
    float32. Query block n sees key blocks n - 1 and n (2w keys)."""
    b, t, h, d = q.shape
    w = window
    n = -(-t // w)
    pad = n * w - t
    f32 = jnp.float32

    def blocks(x, fill=0):  # (B, T, ...) -> (B, N, w, ...), the tail padded
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        return x.reshape(b, n, w, *x.shape[2:])

    def with_previous(x, fill=0):  # (B, N, w, ...) -> (B, N, 2w, ...)
        prev = jnp.pad(x[:, :-1], [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2),
                       constant_values=fill)
        return jnp.concatenate([prev, x], axis=2)

    qb = blocks(q.astype(f32))
    kb, vb = with_previous(blocks(k.astype(f32))), with_previous(blocks(v.astype(f32)))
    sq = blocks(seg, -1)
    sk = with_previous(sq, -2)  # the padding before the first block matches nothing
    scores = jnp.einsum("bnihd,bnjhd->bnhij", qb, kb) * d ** -0.5
    lag = w + jnp.arange(w)[:, None] - jnp.arange(2 * w)[None, :]   # (w, 2w): i - (j - w)
    keep = (lag >= 0) & (lag < w) & (sq[:, :, :, None] == sk[:, :, None, :])
    keep = keep[:, :, None]                                         # (B, N, 1, w, 2w)
    a = _window_weights(scores, keep, gamma.astype(f32)[:, None, None])
    num = jnp.einsum("bnhij,bnjhd->bnihd", a, vb).reshape(b, n * w, h, -1)[:, :t]
    den = jnp.moveaxis(a.sum(-1), 2, 3).reshape(b, n * w, h)[:, :t]
    return num, den


def _delayed(x, w: int):
    """x (B, T, ...) delayed by w positions along T (zeros first)."""
    t = x.shape[1]
    return jnp.pad(x, [(0, 0), (w, 0)] + [(0, 0)] * (x.ndim - 2))[:, :t]


def hybrid_blocked(q, k, fq, fk, v, gamma, *, window: int, segment_ids=None,
                   impl="auto", chunk_size: int = 64):
    """The same function as hybrid_quadratic in O(T (w + F Dv)): impl and chunk_size go to
    the linear attention of the linear part."""
    b, t, h, dv = v.shape
    w = window
    seg = run_ids(segment_ids, b, t)
    num_w, den_w = _window_terms(q, k, v, gamma, w, seg)
    # The linear part: query t against keys s <= t - w of its own run of equal ids (a
    # document), i.e. causal linear attention over the keys delayed by w, a delayed key
    # kept only where it is of the same run as the position it now sits at (runs being
    # contiguous, the queries that reach it are then exactly those of its run). Its
    # normaliser, phi(q_t) . (the kept delayed keys summed over t's run so far), comes from a
    # segmented cumulative sum, so the kernel keeps the head's Dv value columns (a
    # column of ones would be padded to the next power of two).
    kept = (_delayed(seg + 1, w) == seg + 1)[..., None, None]
    fk_late = jnp.where(kept, _delayed(fk, w), 0).astype(fq.dtype)
    v_late = jnp.where(kept, _delayed(v, w), 0).astype(v.dtype)
    num_l = context_parallel.linear_attention(fq, fk_late, v_late, normalize=False,
                                              segment_ids=segment_ids, impl=impl,
                                              chunk_size=chunk_size).astype(jnp.float32)
    keys_so_far = segmented_scan(jnp.add, fk_late.astype(jnp.float32), seg)
    den_l = jnp.einsum("bthf,bthf->bth", fq.astype(jnp.float32), keys_so_far)
    y = (num_w + num_l) / (den_w + den_l)[..., None]
    return y.astype(v.dtype)


def init_state(batch: int, heads: int, head_dim: int, value_dim: int, features: int,
               window: int, dtype):
    """The decode state: the last `window` keys and values in slots pos % window, the
    linear state S (B, H, F, Dv) and normaliser z (B, H, F) of every older key, pos."""
    return {"k": jnp.zeros((batch, window, heads, head_dim), dtype),
            "v": jnp.zeros((batch, window, heads, value_dim), dtype),
            "s": jnp.zeros((batch, heads, features, value_dim), jnp.float32),
            "z": jnp.zeros((batch, heads, features), jnp.float32),
            "pos": jnp.zeros((), jnp.int32)}


def state_after(k, v, fk, window: int, dtype):
    """The decode state after a prompt k (B, T, H, D), v (B, T, H, Dv) from a fresh state
    (position 0, one document): hybrid_step's, in one go. fk (B, T, H, F) float32: the
    keys' features as hybrid_step makes them. Keys 0 .. T-1-w have left the window into
    S and z; slot i holds the latest position p <= T-1 with p = i (mod w), zeros where
    there is none (T < w), as the ring buffer hybrid_step fills."""
    b, t = k.shape[:2]
    w = window
    f32 = jnp.float32
    older = (jnp.arange(t) < t - w).astype(f32)[None, :, None, None]   # left the window
    fk_old = fk.astype(f32) * older
    s = jnp.einsum("bthf,bthd->bhfd", fk_old, v.astype(f32))
    z = fk_old.sum(1)
    slot_pos = (t - 1) - jnp.mod(t - 1 - jnp.arange(w), w)                # (w,)
    present = (slot_pos >= 0)[None, :, None, None]
    ring = lambda x: jnp.where(present, jnp.take(x, jnp.maximum(slot_pos, 0), axis=1),
                               0).astype(dtype)
    return {"k": ring(k), "v": ring(v), "s": s, "z": z,
            "pos": jnp.asarray(t, jnp.int32)}


def hybrid_step(q, k, fq, v, gamma, state, feature_map_k):
    """One token: q, k (B, H, D), fq (B, H, F), v (B, H, Dv) at position state["pos"] ->
    (y (B, H, Dv), next state). The key leaving the window (position pos - w, in the slot
    the new key takes) joins the linear state through feature_map_k ((B, H, D) ->
    (B, H, F))."""
    w = state["k"].shape[1]
    pos = state["pos"]
    slot = pos % w
    f32 = jnp.float32
    old_k = jax.lax.dynamic_index_in_dim(state["k"], slot, 1, keepdims=False)
    old_v = jax.lax.dynamic_index_in_dim(state["v"], slot, 1, keepdims=False)
    leaving = (pos >= w).astype(f32)
    f_old = feature_map_k(old_k).astype(f32) * leaving
    s = state["s"] + jnp.einsum("bhf,bhd->bhfd", f_old, old_v.astype(f32))
    z = state["z"] + f_old
    kc = jax.lax.dynamic_update_index_in_dim(state["k"], k.astype(state["k"].dtype), slot, 1)
    vc = jax.lax.dynamic_update_index_in_dim(state["v"], v.astype(state["v"].dtype), slot, 1)
    filled = jnp.arange(w) <= pos                                     # slots holding a key
    scores = jnp.einsum("bhd,bjhd->bhj", q.astype(f32), kc.astype(f32)) * q.shape[-1] ** -0.5
    a = _window_weights(scores, filled, gamma.astype(f32)[:, None])
    fq = fq.astype(f32)
    num = jnp.einsum("bhj,bjhd->bhd", a, vc.astype(f32)) + jnp.einsum("bhf,bhfd->bhd", fq, s)
    den = a.sum(-1) + jnp.einsum("bhf,bhf->bh", fq, z)
    y = (num / den[..., None]).astype(v.dtype)
    return y, {"k": kc, "v": vc, "s": s, "z": z, "pos": pos + 1}
