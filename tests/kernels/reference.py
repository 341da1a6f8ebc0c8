"""Float64 NumPy references, written as plain loops over tokens, independent of kernels/.

Layout (batch, time, heads, dim). Segments: a new segment starts where the id differs from
the previous position's; a linear state is zeroed there, and an initial state belongs to the
first segment only. Softmax attention: a token sees only tokens with the same id.
"""
import math

import numpy as np


def _segment_starts(segment_ids, b, t):
    starts = np.zeros((b, t), bool)
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return starts


def linear_attention(q, k, v, *, normalize=True, eps=1e-6, log_decay=None, segment_ids=None,
                     initial_state=None):
    """Returns (o (B,T,H,Dv), S (B,H,F,Dv), z (B,H,F))."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, f = q.shape
    dv = v.shape[-1]
    if log_decay is None:
        decay = np.ones((b, t, h))
    else:
        decay = np.exp(np.broadcast_to(np.asarray(log_decay, np.float64), (b, t, h)))
    starts = _segment_starts(segment_ids, b, t)
    o = np.zeros((b, t, h, dv))
    S_out = np.zeros((b, h, f, dv))
    z_out = np.zeros((b, h, f))
    for bi in range(b):
        for hi in range(h):
            if initial_state is None:
                S, z = np.zeros((f, dv)), np.zeros(f)
            elif normalize:
                S = np.array(initial_state[0][bi, hi], np.float64)
                z = np.array(initial_state[1][bi, hi], np.float64)
            else:
                S, z = np.array(initial_state[bi, hi], np.float64), np.zeros(f)
            for ti in range(t):
                if starts[bi, ti]:
                    S, z = np.zeros_like(S), np.zeros_like(z)
                a = decay[bi, ti, hi]
                S = a * S + np.outer(k[bi, ti, hi], v[bi, ti, hi])
                z = a * z + k[bi, ti, hi]
                num = S.T @ q[bi, ti, hi]
                o[bi, ti, hi] = num / (z @ q[bi, ti, hi] + eps) if normalize else num
            S_out[bi, hi], z_out[bi, hi] = S, z
    return o, S_out, z_out


def gated_delta_rule(q, k, v, log_alpha, beta, *, segment_ids=None, initial_state=None):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T; o_t = S_t^T q_t.

    Computed literally with the K x K matrix (I - beta k k^T). Returns (o, S (B,H,K,V)).
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    alpha = np.exp(np.asarray(log_alpha, np.float64))
    beta = np.asarray(beta, np.float64)
    b, t, h, f = q.shape
    dv = v.shape[-1]
    starts = _segment_starts(segment_ids, b, t)
    o = np.zeros((b, t, h, dv))
    S_out = np.zeros((b, h, f, dv))
    eye = np.eye(f)
    for bi in range(b):
        for hi in range(h):
            S = (np.zeros((f, dv)) if initial_state is None
                 else np.array(initial_state[bi, hi], np.float64))
            for ti in range(t):
                if starts[bi, ti]:
                    S = np.zeros_like(S)
                kt, bt = k[bi, ti, hi], beta[bi, ti, hi]
                S = alpha[bi, ti, hi] * (eye - bt * np.outer(kt, kt)) @ S + bt * np.outer(kt, v[bi, ti, hi])
                o[bi, ti, hi] = S.T @ q[bi, ti, hi]
            S_out[bi, hi] = S
    return o, S_out


def chunk_ut_matrix(k, big_g, beta, chunk):
    """The gated delta rule's per-chunk A = strict_lower(beta_t exp(G_t - G_s) k_t.k_s)
    (the preparation inverts I + A), (B, H, N, C, C) float64, from k (B, Tp, H, K), the
    in-chunk cumsum big_g and beta (B, Tp, H); Tp a multiple of chunk."""
    b, tp, h, kdim = np.shape(k)
    n = tp // chunk
    kk = np.moveaxis(np.asarray(k, np.float64), 2, 1).reshape(b, h, n, chunk, kdim)
    gg = np.moveaxis(np.asarray(big_g, np.float64), 2, 1).reshape(b, h, n, chunk)
    bb = np.moveaxis(np.asarray(beta, np.float64), 2, 1).reshape(b, h, n, chunk)
    return np.tril(bb[..., :, None] * np.exp(gg[..., :, None] - gg[..., None, :])
                   * (kk @ np.swapaxes(kk, -1, -2)), -1)


def softmax_attention(q, k, v, *, segment_ids=None, causal=True, scale=None, window=None,
                      keep=None, rate=0.0):
    """Per query: scores over allowed keys, stable softmax, weighted sum. GQA by h // group.
    keep (B, Hkv, group, T, S) bool, rate: dropout on the probabilities with this mask."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = np.zeros((b, t, hq, v.shape[-1]))
    for bi in range(b):
        for hi in range(hq):
            for ti in range(t):
                allowed = []
                for si in range(s):
                    ok = True
                    if causal and si > ti:
                        ok = False
                    if window is not None and (si <= ti - window or (not causal and si >= ti + window)):
                        ok = False
                    if segment_ids is not None and segment_ids[bi][si] != segment_ids[bi][ti]:
                        ok = False
                    if ok:
                        allowed.append(si)
                if not allowed:
                    continue
                sc = np.array([q[bi, ti, hi] @ k[bi, si, hi // group] for si in allowed]) * scale
                p = np.exp(sc - sc.max())
                p /= p.sum()
                if keep is not None:
                    kh, g = hi // group, hi % group
                    p = p * np.array([keep[bi, kh, g, ti, si] for si in allowed]) / (1 - rate)
                o[bi, ti, hi] = sum(pi * v[bi, si, hi // group] for pi, si in zip(p, allowed))
    return o
