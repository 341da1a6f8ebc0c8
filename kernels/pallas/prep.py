"""Parallel-over-chunks preparation shared by the ops (plain JAX: batched matmuls that XLA
runs well; autodiff gives their backward). Everything here is per chunk, so nothing in it
is sequential; the sequential part is kernels.pallas.recurrence.

Layout inside: (B, H, N, C, D), chunk n holding tokens n*C .. n*C+C-1; computed in float32.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from kernels.pallas import common


def chunked(x, b, h, n, c):
    """(B, Tp, H, ...) -> (B, H, N, C, ...)."""
    rest = x.shape[3:]
    x = x.reshape((b, n, c, h) + rest)
    return jnp.moveaxis(x, 3, 1)


def flat(x):
    """(B, H, N, C, D) -> (B*H, N*C, D): the kernels' layout."""
    b, h, n, c, d = x.shape
    return x.reshape(b * h, n * c, d)


def einsum(spec, *xs, dtype):
    """Products of input-dtype operands accumulated in float32 (full float32 precision
    when the inputs are float32; float64 inputs, the tests' oracles, stay float64: GPU
    GEMMs take no float64 operands with a float32 result)."""
    return jnp.einsum(spec, *xs, precision=common.dot_precision(dtype),
                      preferred_element_type=jnp.promote_types(dtype, jnp.float32))


def decay_terms(g):
    """g: (..., C) log-decays of one chunk. Returns G (inclusive cumsum), the decay matrix
    D[t, s] = exp(G_t - G_s) for s <= t (0 above the diagonal) and the masks."""
    c = g.shape[-1]
    big_g = jnp.cumsum(g, axis=-1)
    incl = jnp.tril(jnp.ones((c, c), bool))
    diff = big_g[..., :, None] - big_g[..., None, :]
    # Mask before exp: above the diagonal the difference is positive and could overflow.
    dmat = jnp.exp(jnp.where(incl, diff, -jnp.inf))
    return big_g, dmat, incl


def in_chunk_cumsum(g, chunk, reverse=False):
    """(B, Tp, H) log-decays -> G, their inclusive cumsum within each chunk, same layout
    (what the recurrence kernel reads to form Qg and Kd itself). reverse: the sum from
    each token to its chunk's end (the transpose: dg from dG)."""
    b, tp, h = g.shape
    return lax.cumsum(g.reshape(b, tp // chunk, chunk, h), axis=2,
                      reverse=reverse).reshape(b, tp, h)


def decayed(qc, kc, big_g):
    """Qg = Q*gamma, Kd = K*exp(G_C - G) (float32), for the XLA-side users (linear
    attention's normaliser); the recurrence kernel forms its own."""
    qg = qc.astype(jnp.float32) * jnp.exp(big_g)[..., None]
    kd = kc.astype(jnp.float32) * jnp.exp(big_g[..., -1:] - big_g)[..., None]
    return qg, kd


def intra_chunk(qc, kc, dmat, big_g, dtype):
    """The parts every decayed linear op's preparation writes: P = (Q K^T) * D and
    gcl = G_C (float32 each)."""
    p = einsum("bhntd,bhnsd->bhnts", qc, kc, dtype=dtype) * dmat
    return p, big_g[..., -1]
