"""Softmax attention: full causal (via jax.nn.dot_product_attention), sliding window (banded,
O(T * window) memory), and one query against a KV cache for decoding.

Shapes (B, T, H, D). Grouped-query attention: q has Hq heads, k/v have Hkv with
Hq % Hkv == 0; query head h reads kv head h // (Hq // Hkv). Scores and softmax in float32,
outputs in the query dtype. With segment_ids, a token sees only tokens with the same id.
"""
from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from kernels.common import PRECISION, run_ids

SOFTMAX_IMPLS = ("auto", "xla", "cudnn")
WINDOW_IMPLS = ("auto", "cudnn", "blocked", "masked")


def _check_qkv(q, k, v, name):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{name}: q, k, v must be (batch, time, heads, dim); got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{name}: k {k.shape} and v {v.shape} must agree on batch, time, heads")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{name}: q {q.shape} and k {k.shape} must agree on batch and head dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"{name}: query heads ({q.shape[2]}) must be a multiple of key/value "
                         f"heads ({k.shape[2]}) for grouped-query attention")


def _group(q, hkv):
    """(B, T, Hq, D) -> (B, T, Hkv, G, D)."""
    b, t, hq, d = q.shape
    return q.reshape(b, t, hkv, hq // hkv, d)


def _ungroup(o):
    b, t, hkv, g, d = o.shape
    return o.reshape(b, t, hkv * g, d)


def softmax_attention(q, k, v, *, segment_ids=None, causal=True, scale=None, window=None,
                      impl="auto", dropout_rate=0.0, dropout_rng=None, mask_every_head=False,
                      max_segments=0):
    """Softmax attention with optional causal mask, sliding window and segments.

    window: token t sees s with t - window < s <= t (and s - window < t when not causal).
    impl: "xla", "cudnn" (GPU, bf16/fp16; segments as a mask), or "auto" (cudnn where it
    applies, else xla).
    dropout_rate, dropout_rng: dropout on the attention probabilities (training; nanoGPT's
    attn_dropout). Kept weights are scaled by 1 / (1 - rate). This takes the explicit
    path (scores materialised), since the fused kernels have no dropout.
    mask_every_head: hand cuDNN the segment mask broadcast to every query head rather than
    one shared head. Needed when the call is vmapped and differentiated
    (training.population): cuDNN attention's batching rules (jax <= 0.11.2; jax PRs
    34920, 36702) reshape a vmapped mask to (batch, heads, T, S), which fails for a shared
    head. Costs a (B, H, T, S) bias in place of (B, 1, T, S).
    max_segments: > 0 lets cuDNN take packed documents in its packed-sequence layout
    (each run of equal segment ids its own sequence, as the linear kernels' documents),
    where rows hold at most this many runs: it then computes only the attention within
    each document, where the mask path computes the whole causal T x T and masks it. A
    batch with a longer row takes the mask path (both are compiled; lax.cond picks).
    Causal, no window, as many key heads as query heads, no dropout, not with
    mask_every_head (its vmapped form is unchecked); otherwise the mask path.
    """
    _check_qkv(q, k, v, "softmax_attention")
    if impl not in SOFTMAX_IMPLS:
        raise ValueError(f"softmax_attention: unknown impl {impl!r}; valid: {SOFTMAX_IMPLS}")
    t, s = q.shape[1], k.shape[1]
    if (causal or segment_ids is not None or window is not None) and t != s:
        raise ValueError(f"softmax_attention: causal, window and segment masks need as many "
                         f"queries as keys (got {t} and {s}); for one query against a cache "
                         f"use attend_to_cache")
    if window is not None and (not isinstance(window, numbers.Integral) or window < 1):
        raise ValueError(f"softmax_attention: window must be >= 1, got {window}")
    mask = None
    if segment_ids is not None:
        seg = jnp.asarray(segment_ids)
        if seg.shape != q.shape[:2]:
            raise ValueError(f"softmax_attention: segment_ids shape {seg.shape} must be "
                             f"(batch, time) = {q.shape[:2]}")
        mask = (seg[:, :, None] == seg[:, None, :])[:, None]  # (B, 1, T, S)
    local = None
    if window is not None:
        w = int(window)
        local = (w - 1, 0) if causal else (w - 1, w - 1)
    kwargs = dict(mask=mask, scale=scale, is_causal=causal, local_window_size=local)
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"softmax_attention: dropout_rate must be in [0, 1), got {dropout_rate}")
    if dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError("softmax_attention: dropout_rate > 0 needs a dropout_rng key")
        return _attention_with_dropout(q, k, v, mask, causal, window, scale, dropout_rate,
                                       dropout_rng)

    cudnn_kwargs = kwargs
    if mask is not None and mask_every_head:
        cudnn_kwargs = dict(kwargs, mask=jnp.broadcast_to(
            mask, (mask.shape[0], q.shape[2]) + mask.shape[2:]))
    if (max_segments > 0 and mask is not None and causal and window is None
            and k.shape[2] == q.shape[2] and not mask_every_head
            and (impl == "cudnn" or (impl == "auto" and _cudnn_applies(q)))):
        return _packed_or_masked(q, k, v, seg, scale, int(max_segments), cudnn_kwargs)
    if impl == "auto":
        # cuDNN's flash kernel takes the segment mask as an additive bias (B, 1, T, S): the
        # same flops as causal attention, but no (B, H, T, S) scores kept for the backward.
        if _cudnn_applies(q):
            try:
                return jax.nn.dot_product_attention(q, k, v, implementation="cudnn",
                                                    **cudnn_kwargs)
            except Exception:  # unsupported shape/version: the XLA path is always exact
                pass
        impl = "xla"
    return jax.nn.dot_product_attention(q, k, v, implementation=impl,
                                        **(cudnn_kwargs if impl == "cudnn" else kwargs))


def packed_layout(segment_ids, max_segments: int):
    """cuDNN's packed-sequence layout of each row's runs of equal segment ids (B, T):
    (lengths (B, M) int32, offsets (B, M + 1) int32, runs per row (B,)), M = max_segments;
    a run's offset is its first position in its row; entries past a row's last run are
    -1 (jax's fused_attention_stablehlo.dot_product_attention takes them so). Rows with
    more than M runs are described only up to their M-th run (the caller checks)."""
    b, t = jnp.shape(segment_ids)
    run = run_ids(segment_ids, b, t)  # each token's run: the linear kernels' documents
    starts = jnp.concatenate([jnp.ones((b, 1), bool), run[:, 1:] != run[:, :-1]], axis=1)
    runs = run[:, -1] + 1
    # each run's first position into column `run` (one scatter, no sort); columns past
    # max_segments are dropped, column max_segments keeps the (M+1)-th run's start
    column = jnp.where(starts, run, max_segments + 1)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    first = jnp.full((b, max_segments + 1), -1, jnp.int32).at[rows, column].set(
        jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), mode="drop")
    present = first[:, :max_segments] >= 0
    following = first[:, 1:]
    ends = jnp.where(following >= 0, following, t)
    lengths = jnp.where(present, ends - first[:, :max_segments], -1)
    offsets = jnp.concatenate([first[:, :max_segments], jnp.full((b, 1), -1, jnp.int32)],
                              axis=1)
    return lengths, offsets, runs


def _packed_or_masked(q, k, v, segment_ids, scale, max_segments, cudnn_kwargs):
    """Causal attention within each run of segment ids: cuDNN's packed layout where every
    row has at most max_segments runs, else cuDNN with the mask (see softmax_attention)."""
    def masked(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **cudnn_kwargs)
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused
    except ImportError:  # a jax without it: the mask path is always exact
        return masked(q, k, v)
    lengths, offsets, runs = packed_layout(segment_ids, max_segments)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    def packed(q, k, v):
        return fused.dot_product_attention(
            q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
            kv_offsets=offsets, scale=scale, mask_type=fused.MaskType.PADDING_CAUSAL,
            qkv_layout="BTNH")
    try:
        return jax.lax.cond(jnp.all(runs <= max_segments), packed, masked, q, k, v)
    except Exception:  # a GPU before Hopper (cuDNN packs on sm90+), a cuDNN or jax
        return masked(q, k, v)  # without it: the mask path is always exact


def _cudnn_applies(q) -> bool:
    """cuDNN's flash attention takes these inputs: a GPU, bf16/fp16, head dim a multiple
    of 8 up to 128."""
    return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
            and q.shape[-1] % 8 == 0 and q.shape[-1] <= 128)


def _masked_softmax(scores, mask):
    """softmax over the last axis of float32 scores with a boolean mask."""
    scores = jnp.where(mask, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # fully masked rows: weights 0, output 0
    p = jnp.where(mask, jnp.exp(scores - m), 0.0)
    return p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), jnp.finfo(jnp.float32).tiny)


def _masked_softmax_read(scores, mask, v_spec, v):
    """_masked_softmax, then read v in float32."""
    p = _masked_softmax(scores, mask)
    return jnp.einsum(v_spec, p, v.astype(jnp.float32), precision=PRECISION)


def _attention_with_dropout(q, k, v, mask, causal, window, scale, rate, rng):
    """Explicit scores -> float32 softmax -> dropout on the probabilities -> read v."""
    _, t, _, d = q.shape
    s = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg = _group(q, k.shape[2])
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, precision=PRECISION,
                        preferred_element_type=jnp.float32) * scale
    qpos, kpos = jnp.arange(t)[:, None], jnp.arange(s)[None, :]
    keep = jnp.ones((t, s), bool)
    if causal:
        keep &= kpos <= qpos
    if window is not None:
        keep &= (kpos > qpos - window) & (causal | (kpos < qpos + window))
    full = keep[None, None, None]
    if mask is not None:  # (B, 1, T, S) segment mask -> (B, 1, 1, T, S)
        full = full & mask[:, :, None]
    p = _masked_softmax(scores, full)
    kept = jax.random.bernoulli(rng, 1.0 - rate, p.shape)
    p = jnp.where(kept, p / (1.0 - rate), 0.0)
    o = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v, precision=PRECISION,
                   preferred_element_type=jnp.float32)
    return _ungroup(o).astype(q.dtype)


def _sliding_window_masked(q, k, v, window, segment_ids, scale):
    """Reference form: the full T x T score matrix with a band mask."""
    b, t, _, _ = q.shape
    qg = _group(q, k.shape[2]).astype(jnp.float32)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(jnp.float32),
                        precision=PRECISION) * scale
    pos = jnp.arange(t)
    band = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    mask = band[None, None, None]
    if segment_ids is not None:
        seg = jnp.asarray(segment_ids)
        mask = mask & (seg[:, :, None] == seg[:, None, :])[:, None, None]
    o = _masked_softmax_read(scores, mask, "bkgts,bskd->btkgd", v)
    return _ungroup(o).astype(q.dtype)


def _sliding_window_blocked(q, k, v, window, segment_ids, scale):
    """Banded form: each block of `window` queries attends to the keys of its own block and
    the previous one, which hold every key within the window. Memory O(T * window)."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    w = window
    n = -(-t // w)
    pad = n * w - t

    def blocks(x):  # (B, T, ...) -> (B, n, w, ...), zero-padded at the end
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape((b, n, w) + x.shape[2:])

    def with_previous(x):  # (B, n, w, ...) -> (B, n, 2w, ...): previous block then own block
        prev = jnp.pad(x, [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2))[:, :-1]
        return jnp.concatenate([prev, x], axis=2)

    qb = blocks(_group(q, hkv).astype(jnp.float32))  # (B, n, w, Hkv, G, D)
    kb = with_previous(blocks(k.astype(jnp.float32)))  # (B, n, 2w, Hkv, D)
    vb = with_previous(blocks(v))
    scores = jnp.einsum("bnakgd,bnckd->bnkgac", qb, kb, precision=PRECISION) * scale

    qpos = jnp.arange(n)[:, None] * w + jnp.arange(w)[None, :]  # (n, w)
    kpos = jnp.arange(n)[:, None] * w - w + jnp.arange(2 * w)[None, :]  # (n, 2w)
    band = ((kpos[:, None, :] <= qpos[:, :, None]) & (kpos[:, None, :] > qpos[:, :, None] - w)
            & (kpos[:, None, :] >= 0))  # (n, w, 2w)
    mask = band[None, :, None, None]  # (1, n, 1, 1, w, 2w)
    if segment_ids is not None:
        sb = blocks(jnp.asarray(segment_ids))
        same = sb[:, :, :, None] == with_previous(sb)[:, :, None, :]  # (B, n, w, 2w)
        mask = mask & same[:, :, None, None]
    o = _masked_softmax_read(scores, mask, "bnkgac,bnckd->bnakgd", vb)  # (B,n,w,Hkv,G,D)
    o = o.reshape((b, n * w) + o.shape[3:])[:, :t]
    return _ungroup(o).astype(q.dtype)


def sliding_window_attention(q, k, v, *, window, segment_ids=None, scale=None, impl="auto",
                             mask_every_head=False):
    """Causal softmax attention over the last `window` tokens: t sees t - window < s <= t.

    impl: "cudnn" (GPU, bf16/fp16, head dim a multiple of 8 up to 128: cuDNN's flash
    kernel with its local window, segments as a mask), "blocked" (banded, never builds
    T x T), "masked" (reference), "auto" (cudnn where it applies: as accurate as the
    banded form in bf16 and 2-4x faster (docs/benchmarks.md); else blocked when the
    sequence is longer than two windows, else masked).
    mask_every_head: as softmax_attention's (the cuDNN path under vmap and grad).
    """
    _check_qkv(q, k, v, "sliding_window_attention")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"sliding_window_attention: q has {q.shape[1]} tokens, k has "
                         f"{k.shape[1]}; they must match")
    if not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"sliding_window_attention: window must be a positive int, got "
                         f"{window!r}")
    if impl not in WINDOW_IMPLS:
        raise ValueError(f"sliding_window_attention: unknown impl {impl!r}; valid: "
                         f"{WINDOW_IMPLS}")
    if segment_ids is not None and jnp.shape(segment_ids) != q.shape[:2]:
        raise ValueError(f"sliding_window_attention: segment_ids shape "
                         f"{jnp.shape(segment_ids)} must be (batch, time) = {q.shape[:2]}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if impl == "cudnn" or (impl == "auto" and _cudnn_applies(q)):
        try:
            return softmax_attention(q, k, v, segment_ids=segment_ids, causal=True,
                                     scale=scale, window=int(window), impl="cudnn",
                                     mask_every_head=mask_every_head)
        except Exception:  # auto, unsupported shape/version: the banded form is exact
            if impl == "cudnn":
                raise
    if impl == "auto":
        impl = "blocked" if q.shape[1] > 2 * window else "masked"
    fn = _sliding_window_blocked if impl == "blocked" else _sliding_window_masked
    return fn(q, k, v, int(window), segment_ids, scale)


def attend_to_cache(q_t, k_cache, v_cache, length_or_mask, scale=None):
    """One query per sequence against a KV cache (decoding).

    q_t: (B, Hq, D); k_cache, v_cache: (B, S, Hkv, D).
    length_or_mask: (B,) or scalar int — cache positions [0, length) are valid — or a (B, S)
    boolean mask of valid slots (e.g. the filled slots of a ring buffer; softmax does not
    care about order). Returns (B, Hq, D) in q_t's dtype; a row with no valid slot gives 0.
    """
    if q_t.ndim != 3 or k_cache.ndim != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"attend_to_cache: expected q_t (B,H,D) and caches (B,S,H,D); got "
                         f"{q_t.shape}, {k_cache.shape}, {v_cache.shape}")
    b, hq, d = q_t.shape
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    if hq % hkv:
        raise ValueError(f"attend_to_cache: query heads ({hq}) must be a multiple of cache "
                         f"heads ({hkv})")
    lm = jnp.asarray(length_or_mask)
    if lm.dtype == jnp.bool_:
        valid = jnp.broadcast_to(lm, (b, s))
    else:
        valid = jnp.arange(s)[None, :] < jnp.broadcast_to(lm, (b,))[:, None]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg = q_t.reshape(b, hkv, hq // hkv, d).astype(jnp.float32)
    scores = jnp.einsum("bkgd,bskd->bkgs", qg, k_cache.astype(jnp.float32),
                        precision=PRECISION) * scale
    o = _masked_softmax_read(scores, valid[:, None, None, :], "bkgs,bskd->bkgd", v_cache)
    return o.reshape(b, hq, v_cache.shape[-1]).astype(q_t.dtype)


def ring_buffer_mask(num_written, size):
    """(B, size) valid-slot mask of a ring buffer after `num_written` (B,) writes."""
    return jnp.arange(size)[None, :] < jnp.minimum(jnp.asarray(num_written), size)[..., None]
