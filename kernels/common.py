"""Helpers shared by the pure-JAX linear-attention forms: segments, log-decay sums, layout.

Internally every form works head-major, (B, H, T, dim), in float32; `ops.py` converts from
and to the public (B, T, H, dim) layout and the input dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# float32 matmuls at full precision (GPUs otherwise may use TF32 and lose ~3 digits).
PRECISION = jax.lax.Precision.HIGHEST
NEG_INF = -jnp.inf


def einsum(spec: str, *operands):
    return jnp.einsum(spec, *operands, precision=PRECISION)


def pad_axis(x, size: int, axis: int, mode: str = "constant"):
    """x padded at the end of `axis` up to `size` (zeros unless mode says otherwise)."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, mode=mode)


def run_ids(segment_ids, batch: int, length: int):
    """Index of the run of equal segment ids each position belongs to, (B, T) int32.

    A linear state restarts wherever the id differs from the previous position's, so two
    runs that happen to share an id are still separate documents. The first run is 0; an
    initial state belongs to run 0 only.
    """
    if segment_ids is None:
        return jnp.zeros((batch, length), jnp.int32)
    seg = jnp.asarray(segment_ids)
    change = (seg[:, 1:] != seg[:, :-1]).astype(jnp.int32)
    return jnp.concatenate(
        [jnp.zeros((batch, 1), jnp.int32), jnp.cumsum(change, axis=1, dtype=jnp.int32)], axis=1)


def visible_keys(length: int, docs=None, window: int | None = None):
    """(B|1, 1, T, S) bool: key s is visible from query t: causal (s <= t), within the
    last `window` positions when one is given, and of the same document (docs (B, T):
    equal ids, run_ids' runs or raw segment ids as the caller's kernel counts them; None:
    one document). The dense reference forms' mask."""
    lag = jnp.arange(length)[:, None] - jnp.arange(length)[None, :]
    keep = lag >= 0
    if window is not None:
        keep = keep & (lag < window)
    keep = keep[None, None]
    if docs is not None:
        keep = keep & (docs[:, :, None] == docs[:, None, :])[:, None]
    return keep


def segmented_scan(op, x, run):
    """op (associative, elementwise: jnp.add, jnp.maximum) over the prefix of each
    position's run along axis 1: x (B, T, ...), run (B, T) non-decreasing along T
    (run_ids). The pair operator keeps the later value unless both ends lie in one run:
    associative because runs are contiguous, so lax.associative_scan applies (no prefix
    is subtracted, so a long packed row loses nothing to cancellation)."""
    r = jnp.broadcast_to(run.reshape(run.shape + (1,) * (x.ndim - 2)), x.shape)

    def combine(left, right):
        (run_left, value_left), (run_right, value_right) = left, right
        return run_right, jnp.where(run_left == run_right, op(value_left, value_right),
                                    value_right)

    return jax.lax.associative_scan(combine, (r, x), axis=1)[1]


def segsum(g):
    """L[..., t, s] = sum of g[..., r] for s < r <= t (0 on and above the diagonal).

    Summing only the terms inside (s, t] rather than subtracting two cumulative sums keeps
    exp(L) accurate when a very negative log-decay sits elsewhere in the sequence; -inf
    (a hard reset) and NaN reach exactly the spans that hold them, as in a plain sum.
    The sums run down t over x[t', s] = g_t' (t' > s) as log2(C) shifted adds
    (Hillis-Steele prefix sums): elementwise passes that XLA fuses, C / log2(C) times
    less work than a matmul with a triangular matrix of ones (which also needs a patch
    for 0 * -inf); XLA's CPU cumsum is a reduce-window, slower than both
    (docs/benchmarks.md, session 24).
    """
    c = g.shape[-1]
    x = jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), g[..., :, None], 0.0)
    shift = 1
    rows_down = [(0, 0)] * (x.ndim - 2)
    while shift < c:  # x[t] += x[t - shift]: row t then sums rows (t - 2 shift, t]
        x = x + jnp.pad(x[..., :c - shift, :], rows_down + [(shift, 0), (0, 0)])
        shift *= 2
    return x


def suffix_sum_exclusive(g):
    """out[..., s] = sum of g[..., r] for r > s (a direct sum, not a difference)."""
    rev = jnp.cumsum(jnp.flip(g[..., 1:], axis=-1), axis=-1)
    return jnp.concatenate([jnp.flip(rev, axis=-1), jnp.zeros_like(g[..., :1])], axis=-1)


def masked_exp(mask, x):
    """exp(x) where mask holds, exactly 0 elsewhere; masking happens before exp, so neither
    the forward nor the backward pass sees inf * 0."""
    return jnp.exp(jnp.where(mask, x, NEG_INF))


def to_heads_first(x):
    """(B, T, H, ...) -> (B, H, T, ...)."""
    return jnp.moveaxis(x, 2, 1)


def to_time_second(x):
    """(B, H, T, ...) -> (B, T, H, ...)."""
    return jnp.moveaxis(x, 1, 2)
