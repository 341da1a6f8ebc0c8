"""Attention transfer: each converted layer against the frozen softmax layer it replaces.

Layer by layer on the same inputs: the teacher model runs its own residual stream, and
at every converted layer i the student's mixer and the teacher's softmax mixer both read
the teacher's normalised hidden state h_i = mixer_norm_i(x_i) (so a layer learns from
the inputs it will see, and no layer's error feeds the next one; the gradient of layer
i's loss reaches only layer i's parameters). Two losses (training.convert's
convert.loss):

  attention_ce  Hedgehog (Zhang et al. 2024): the cross-entropy between the softmax
                attention weights A_t and the linear attention's weights
                A_s[t, s] = phi(q_t) . phi(k_s) / sum_s' phi(q_t) . phi(k_s'), mean over
                heads and query tokens, summed over layers. Defined for the mixers
                whose Mixer.has_attention_weights holds: the normalised feature-map
                mixers (hedgehog, linear but identity, performer, taylor) and LoLCATs'
                hedgehog_window (its window and linear weights together).
  output_mse    LoLCATs (Zhang et al. 2024): the mean squared error between the two
                layers' outputs (after the output projection), summed over layers. Any
                mixer.

`agreement` reports per layer how close the linear attention came: attn_overlap =
sum_s min(A_t, A_s) averaged over queries (1 - total variation; 1 is the same
distribution), attn_kl = KL(A_t || A_s), and, for every mixer, out_rel_err =
|y_s - y_t| / |y_t| (Frobenius, over the batch) and out_cos.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.common import visible_keys
from models.layers import segment_positions
from models.mixers.attention import SlidingWindowAttention, _Attention

LOSSES = ("attention_ce", "output_mse")
_HI = jax.lax.Precision.HIGHEST
_LOG_EPS = 1e-12


def teacher_attention(mixer: _Attention, h, segment_ids=None):
    """A softmax (or sliding-window) mixer on h (B, T, d): (its output (B, T, d), its
    attention weights (B, H, T, T) float32), the weights computed as its kernel does
    (1/sqrt(D), grouped-query heads h // (H / KV), RoPE)."""
    t = h.shape[1]
    q, k, _ = mixer._qkv(h, segment_positions(segment_ids, t))
    k = jnp.repeat(k, mixer.num_heads // mixer.kv_heads, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), k.astype(jnp.float32),
                        precision=_HI) * mixer.head_dim ** -0.5
    window = mixer.window if isinstance(mixer, SlidingWindowAttention) else None
    mask = visible_keys(t, segment_ids, window)  # the softmax kernel's: same segment id
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return mixer(h, segment_ids=segment_ids), jnp.where(mask, weights, 0.0)


def has_attention_weights(mixer) -> bool:
    """Whether the mixer's attention is a set of normalised weights over the keys
    (Mixer.has_attention_weights): attention_ce and the attention agreement need them."""
    return type(mixer).has_attention_weights(mixer.cfg)


def student_attention(mixer, h, segment_ids=None):
    """The converted mixer's attention weights (B, H, T, T) float32 on h
    (Mixer.attention_weights: a feature-map mixer's phi(q_t) . phi(k_s) over their row
    sums, LoLCATs' window and linear terms over their one normaliser)."""
    if not has_attention_weights(mixer):
        raise ValueError(f"mixer {mixer.name!r} has no normalised attention weights; "
                         f"use convert.loss=output_mse")
    return mixer.attention_weights(h, segment_ids)


def converted_layers(teacher, student, inputs, segment_ids, converted):
    """For each converted layer index (in order): (i, h_i, teacher mixer, student mixer),
    h_i the teacher's normalised hidden state there. Both models unrolled."""
    positions = (None if teacher.pos_embed is None
                 else segment_positions(segment_ids, inputs.shape[1]))
    x = teacher._embed(inputs, positions)
    out = []
    for i, (tb, sb) in enumerate(zip(teacher.blocks, student.blocks)):
        if i in converted:
            out.append((i, tb.mixer_norm(x), tb.mixer, sb.mixer))
        if i >= max(converted):
            break
        x = tb(x, segment_ids=segment_ids, deterministic=True)
    return out


def _query_mask(batch, shape):
    """(B, H, T, 1) float32: the query tokens that count (the batch's loss mask), for
    attention weights of `shape` (B, H, T, T)."""
    m = batch["mask"].astype(jnp.float32)[:, None, :, None]
    return jnp.broadcast_to(m, shape[:3] + (1,))


def layer_loss(kind: str, tmixer, smixer, h, segment_ids, batch):
    """One layer's transfer loss (a scalar): attention_ce or output_mse."""
    m = batch["mask"].astype(jnp.float32)
    if kind == "output_mse":
        y_t = jax.lax.stop_gradient(tmixer(h, segment_ids=segment_ids)).astype(jnp.float32)
        y_s = smixer(h, segment_ids=segment_ids).astype(jnp.float32)
        err = jnp.mean(jnp.square(y_s - y_t), axis=-1)
        return jnp.sum(err * m) / jnp.maximum(jnp.sum(m), 1.0)
    _, a_t = teacher_attention(tmixer, h, segment_ids)
    a_t = jax.lax.stop_gradient(a_t)
    a_s = student_attention(smixer, h, segment_ids)
    # LoLCATs' clamp: a weight below eps counts as eps and passes no gradient (rather
    # than a_t / eps = 1e12 into the normaliser's gradient).
    ce = -jnp.sum(a_t * jnp.log(jnp.maximum(a_s, _LOG_EPS)), axis=-1, keepdims=True)
    qm = _query_mask(batch, a_t.shape)
    return jnp.sum(ce * qm) / jnp.maximum(jnp.sum(qm), 1.0)


def transfer_loss(kind: str, teacher, student, batch, converted, packed: bool = True):
    """(sum over converted layers of layer_loss, the per-layer losses (L,))."""
    seg = batch["segment_ids"] if packed else None
    losses = [layer_loss(kind, tm, sm, h, seg, batch)
              for _, h, tm, sm in converted_layers(teacher, student, batch["inputs"], seg,
                                                   converted)]
    per_layer = jnp.stack(losses)
    return jnp.sum(per_layer), per_layer


def agreement(teacher, student, batch, converted, packed: bool = True) -> dict:
    """Per converted layer, sums over the batch's counted queries (divide by "count"):
    attn_overlap, attn_kl (NaN where the mixer has no attention weights), and the
    squared norms for out_rel_err and out_cos."""
    seg = batch["segment_ids"] if packed else None
    rows = []
    for _, h, tm, sm in converted_layers(teacher, student, batch["inputs"], seg, converted):
        y_t, a_t = teacher_attention(tm, h, seg)
        y_s = sm(h, segment_ids=seg)
        m = batch["mask"].astype(jnp.float32)[..., None]
        y_t, y_s = y_t.astype(jnp.float32) * m, y_s.astype(jnp.float32) * m
        row = {"err2": jnp.sum(jnp.square(y_s - y_t)), "ref2": jnp.sum(jnp.square(y_t)),
               "dot": jnp.sum(y_s * y_t), "stu2": jnp.sum(jnp.square(y_s))}
        qm = _query_mask(batch, a_t.shape)
        if has_attention_weights(sm):
            a_s = student_attention(sm, h, seg)
            overlap = jnp.sum(jnp.minimum(a_t, a_s), axis=-1, keepdims=True)
            kl = jnp.sum(jnp.where(a_t > 0, a_t * (jnp.log(a_t + _LOG_EPS)
                                                  - jnp.log(a_s + _LOG_EPS)), 0.0),
                         axis=-1, keepdims=True)
            row.update(overlap=jnp.sum(overlap * qm), kl=jnp.sum(kl * qm))
        else:
            row.update(overlap=jnp.nan, kl=jnp.nan)
        row["count"] = jnp.sum(qm)
        rows.append(row)
    return {k: jnp.stack([jnp.asarray(r[k], jnp.float32) for r in rows]) for k in rows[0]}


def summarise(sums: dict, layers: list[int]) -> list[dict]:
    """The per-layer report from agreement's sums (added over batches), as floats."""
    import math
    out = []
    for j, i in enumerate(layers):
        count = float(sums["count"][j])
        ov, kl = float(sums["overlap"][j]), float(sums["kl"][j])
        ref2, err2 = float(sums["ref2"][j]), float(sums["err2"][j])
        stu2, dot = float(sums["stu2"][j]), float(sums["dot"][j])
        out.append({"layer": i,
                    "attn_overlap": None if math.isnan(ov) else ov / count,
                    "attn_kl": None if math.isnan(kl) else kl / count,
                    "out_rel_err": math.sqrt(err2 / ref2) if ref2 > 0 else None,
                    "out_cos": dot / math.sqrt(ref2 * stu2) if ref2 * stu2 > 0 else None})
    return out
