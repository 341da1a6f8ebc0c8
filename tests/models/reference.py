"""Float64 NumPy references of whole mixer layers, written from the papers' equations as
loops over tokens, independent of kernels/ and of the model code. They read the
parameters of a built mixer and return y (B, T, d_model)."""
import math

import numpy as np


def p(var):
    return np.asarray(var[...], np.float64)


def silu(x):
    return x / (1 + np.exp(-x))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(x))


def rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * scale


def rope(x, theta):
    """x (T, H, D) at positions 0..T-1, half-split rotation."""
    t, _, d = x.shape
    freqs = theta ** (-np.arange(0, d // 2) * 2.0 / d)
    ang = np.arange(t)[:, None] * freqs[None]  # (T, D/2)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def heads(x, h):
    return x.reshape(x.shape[0], h, -1)


def _elu1(a):
    return np.where(a > 0, a + 1, np.exp(np.minimum(a, 0)))


def _hedgehog_softmax(w, b):
    """fla's HedgehogFeatureMap with per-head W (H, D, D), b (H, D):
    softmax over the 2 D features of [2a, -2a], a = x W + b."""
    def phi(x):  # x (T, H, D)
        a = np.einsum("thd,hde->the", x, w) + b
        e = np.concatenate([2 * a, -2 * a], -1)
        e = np.exp(e - e.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return phi


def linear_normalized(m, x, phi_q, phi_k=None, eps=1e-6):
    """Katharopoulos et al.: o_t = S_t^T phi(q_t) / (z_t . phi(q_t) + eps)."""
    phi_k = phi_k or phi_q
    h = m.num_heads
    out = []
    for xb in np.asarray(x, np.float64):
        q = phi_q(heads(xb @ p(m.q_proj.kernel), h))
        k = phi_k(heads(xb @ p(m.k_proj.kernel), h))
        v = heads(xb @ p(m.v_proj.kernel), h)
        S = np.zeros((h, q.shape[-1], v.shape[-1]))
        z = np.zeros((h, q.shape[-1]))
        o = np.zeros_like(v)
        for t in range(len(xb)):
            S += k[t][:, :, None] * v[t][:, None, :]
            z += k[t]
            o[t] = np.einsum("hf,hfv->hv", q[t], S) / (np.einsum("hf,hf->h", q[t], z)[:, None] + eps)
        out.append(o.reshape(len(xb), -1) @ p(m.o_proj.kernel))
    return np.stack(out)


def linear_elu(m, x):
    return linear_normalized(m, x, _elu1)


def hedgehog(m, x):
    """Separate query and key maps (fla's default)."""
    fq, fk = m.feature_map_q, m.feature_map_k
    return linear_normalized(m, x, _hedgehog_softmax(p(fq.kernel), p(fq.bias)),
                             _hedgehog_softmax(p(fk.kernel), p(fk.bias)))


def performer(m, x):
    """FAVOR+ with keys shifted by the running max of their exponent over the prefix:
    key s enters query t's sums as (exp(e_s - c_s) + eps) exp(c_s - c_t), written here
    directly as a sum over s (not as a decayed state) to be independent of the model."""
    omega, d, eps = p(m.omega), m.head_dim, m.feature_eps
    r = 1 / math.sqrt(len(omega))

    def logits(a):
        a = a * d ** -0.25
        return a @ omega.T - 0.5 * np.sum(a * a, -1, keepdims=True)
    h, out = m.num_heads, []
    for xb in np.asarray(x, np.float64):
        lq = logits(heads(xb @ p(m.q_proj.kernel), h))  # (T, H, m)
        lk = logits(heads(xb @ p(m.k_proj.kernel), h))
        v = heads(xb @ p(m.v_proj.kernel), h)
        q = r * (np.exp(lq - lq.max(-1, keepdims=True)) + eps)
        c = np.maximum.accumulate(lk.max(-1), axis=0)  # (T, H), over the causal prefix
        o = np.zeros_like(v)
        for t in range(len(xb)):
            k = r * (np.exp(lk[:t + 1] - c[:t + 1, :, None]) + eps) \
                * np.exp(c[:t + 1] - c[t])[..., None]  # (t+1, H, m)
            num = np.einsum("hf,shf,shv->hv", q[t], k, v[:t + 1])
            den = np.einsum("hf,shf->h", q[t], k)
            o[t] = num / (den[:, None] + m.denominator_eps)
        out.append(o.reshape(len(xb), -1) @ p(m.o_proj.kernel))
    return np.stack(out)


def _delta_inputs(m, xb, eps):
    """q, k, v (T, H, D) and beta (T, H) of a delta-rule layer for one sequence xb (T, d)."""
    h, d = m.num_heads, m.head_dim
    l2 = lambda a: a / np.sqrt(np.sum(a * a, -1, keepdims=True) + eps)
    q = l2(heads(_conv_silu(xb @ p(m.q_proj.kernel), p(m.q_conv.kernel)), h)) / math.sqrt(d)
    k = l2(heads(_conv_silu(xb @ p(m.k_proj.kernel), p(m.k_conv.kernel)), h))
    v = heads(_conv_silu(xb @ p(m.v_proj.kernel), p(m.v_conv.kernel)), h)
    return q, k, v, sigmoid(xb @ p(m.b_proj.kernel))


def deltanet(m, x, eps=1e-6):
    """DeltaNet: the delta rule with no decay, plain RMSNorm output."""
    h, d = m.num_heads, m.head_dim
    out = []
    for xb in np.asarray(x, np.float64):
        q, k, v, beta = _delta_inputs(m, xb, eps)
        S = np.zeros((h, d, d))
        o = np.zeros((len(xb), h, d))
        for t in range(len(xb)):
            for i in range(h):
                err = v[t, i] - S[i].T @ k[t, i]  # what the memory misses at this key
                S[i] = S[i] + beta[t, i] * np.outer(k[t, i], err)
                o[t, i] = S[i].T @ q[t, i]
        y = rms_norm(o, p(m.o_norm.scale), m.cfg.norm_eps)
        out.append(y.reshape(len(xb), -1) @ p(m.o_proj.kernel))
    return np.stack(out)


def _conv_silu(x, w):
    """Causal depthwise conv, y_t = sum_i w_i x_{t-(c-1)+i}, then SiLU. x (T, C), w (c, C)."""
    c = w.shape[0]
    xp = np.concatenate([np.zeros((c - 1, x.shape[1])), x])
    return silu(sum(w[i] * xp[i:i + len(x)] for i in range(c)))


def gated_deltanet(m, x, eps=1e-6):
    """Gated DeltaNet layer (paper eq. 10, fla's layer)."""
    h, d = m.num_heads, m.head_dim
    out = []
    for xb in np.asarray(x, np.float64):
        q, k, v, beta = _delta_inputs(m, xb, eps)
        alpha = np.exp(-np.exp(p(m.A_log)) * softplus(xb @ p(m.a_proj.kernel) + p(m.dt_bias)))
        S = np.zeros((h, d, d))  # (keys, values) per head
        o = np.zeros((len(xb), h, d))
        for t in range(len(xb)):
            for i in range(h):
                kk = k[t, i]
                S[i] = alpha[t, i] * (S[i] - beta[t, i] * np.outer(kk, kk @ S[i])) \
                    + beta[t, i] * np.outer(kk, v[t, i])
                o[t, i] = S[i].T @ q[t, i]
        g = heads(xb @ p(m.g_proj.kernel), h)
        y = rms_norm(o, p(m.o_norm.scale), m.cfg.norm_eps) * silu(g)
        out.append(y.reshape(len(xb), -1) @ p(m.o_proj.kernel))
    return np.stack(out)


def window_softmax(m, x, window=None):
    """Sliding-window softmax attention with RoPE: t attends to t-window < s <= t
    (window=None: the mixer's window, or all of the past for full softmax)."""
    h, kvh, d = m.num_heads, m.kv_heads, m.head_dim
    w = window or getattr(m, "window", None) or x.shape[1]
    out = []
    for xb in np.asarray(x, np.float64):
        q = rope(heads(xb @ p(m.q_proj.kernel), h), m.cfg.rope_theta)
        k = rope(heads(xb @ p(m.k_proj.kernel), kvh), m.cfg.rope_theta)
        v = heads(xb @ p(m.v_proj.kernel), kvh)
        o = np.zeros_like(q)
        for t in range(len(xb)):
            lo = max(0, t - w + 1)
            for i in range(h):
                j = i // (h // kvh)
                s = k[lo:t + 1, j] @ q[t, i] / math.sqrt(d)
                a = np.exp(s - s.max())
                o[t, i] = (a / a.sum()) @ v[lo:t + 1, j]
        out.append(o.reshape(len(xb), -1) @ p(m.o_proj.kernel))
    return np.stack(out)


def based(m, x, eps=1e-6):
    """Based: Taylor linear attention on q, k projected to d' dims (kernel 1 + s + s^2/2,
    s = q.k / sqrt(d')), normalised, plus sliding-window softmax."""
    lin = m.linear
    h = lin.num_heads
    out = []
    for xb in np.asarray(x, np.float64):
        q = heads(xb @ p(lin.q_proj.kernel), h)
        k = heads(xb @ p(lin.k_proj.kernel), h)
        v = heads(xb @ p(lin.v_proj.kernel), h)
        dp = q.shape[-1]
        o = np.zeros_like(v)
        for t in range(len(xb)):
            s = np.einsum("shd,hd->sh", k[:t + 1], q[t]) / math.sqrt(dp)  # (t+1, H)
            kern = 1 + s + s * s / 2
            o[t] = np.einsum("sh,shv->hv", kern, v[:t + 1]) / (kern.sum(0)[:, None] + eps)
        out.append(o.reshape(len(xb), -1) @ p(lin.o_proj.kernel))
    return np.stack(out) + window_softmax(m.window, x)


def lightning(m, x):
    """Lightning attention: silu q, k, v; S_t = exp(-slope_h) S_{t-1} + k v^T; no
    denominator; RMSNorm over heads; sigmoid output gate."""
    h, d = m.num_heads, m.head_dim
    slopes = np.asarray(m.slopes)
    out = []
    for xb in np.asarray(x, np.float64):
        qkv = silu(xb @ p(m.qkv_proj.kernel)).reshape(len(xb), 3, h, d)
        S = np.zeros((h, d, d))
        o = np.zeros((len(xb), h, d))
        for t in range(len(xb)):
            S = np.exp(-slopes)[:, None, None] * S + qkv[t, 1][:, :, None] * qkv[t, 2][:, None, :]
            o[t] = np.einsum("hk,hkv->hv", qkv[t, 0], S)
        y = rms_norm(o.reshape(len(xb), -1), p(m.norm.scale), m.cfg.norm_eps)
        y = sigmoid(xb @ p(m.output_gate.kernel)) * y
        out.append(y @ p(m.out_proj.kernel))
    return np.stack(out)


def hedgehog_window(m, x):
    """LoLCATs' hybrid layer (hybrid_attention_quadratic in HazyResearch/lolcats): for
    query t, keys t-w < s <= t weighted gamma exp(q.k / sqrt(d) - max over those keys),
    older keys phi_q(q).phi_k(k), one normaliser; gamma = sigmoid(window factor); RoPE
    on q and k before both."""
    h, d, w = m.num_heads, m.head_dim, m.window
    phi_q = _hedgehog_softmax(p(m.feature_map_q.kernel), p(m.feature_map_q.bias))
    phi_k = _hedgehog_softmax(p(m.feature_map_k.kernel), p(m.feature_map_k.bias))
    gamma = sigmoid(p(m.window_factors))
    out = []
    for xb in np.asarray(x, np.float64):
        q = rope(heads(xb @ p(m.q_proj.kernel), h), m.cfg.rope_theta)
        k = rope(heads(xb @ p(m.k_proj.kernel), h), m.cfg.rope_theta)
        v = heads(xb @ p(m.v_proj.kernel), h)
        fq, fk = phi_q(q), phi_k(k)
        o = np.zeros_like(v)
        for t in range(len(xb)):
            lo = max(0, t - w + 1)
            for i in range(h):
                s = k[lo:t + 1, i] @ q[t, i] / math.sqrt(d)
                a_sm = gamma[i] * np.exp(s - s.max())
                a_ln = fk[:lo, i] @ fq[t, i]
                o[t, i] = (a_sm @ v[lo:t + 1, i] + a_ln @ v[:lo, i]) / (a_sm.sum() + a_ln.sum())
        out.append(o.reshape(len(xb), -1) @ p(m.o_proj.kernel))
    return np.stack(out)
