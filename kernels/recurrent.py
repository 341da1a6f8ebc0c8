"""Recurrent (token-by-token `lax.scan`) forms: the oracles the other forms are tested against.

Never builds a T x T array. Head-major float32 inputs (B, H, T, dim); `run` (B, T) is the
run index per token (kernels.common.run_ids): the state is zeroed where it changes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.common import einsum


def _time_major(x, axis=2):
    return jnp.moveaxis(x, axis, 0)


def _new_run(run):
    """(T, B) bool: True where a token starts a new run (never at t = 0: the initial state
    belongs to the first run)."""
    first = jnp.zeros_like(run[:, :1], dtype=bool)
    return _time_major(jnp.concatenate([first, run[:, 1:] != run[:, :-1]], axis=1), 1)


def linear_attention_recurrent(q, k, v, g, run, state):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T ; o_t = S_t^T q_t. Returns (o (B,H,T,Dv), S_T)."""

    def step(s, x):
        q_t, k_t, v_t, g_t, reset = x
        s = jnp.where(reset[:, None, None, None], 0.0, s)
        s = jnp.exp(g_t)[..., None, None] * s + k_t[..., :, None] * v_t[..., None, :]
        return s, einsum("bhf,bhfd->bhd", q_t, s)

    xs = (_time_major(q), _time_major(k), _time_major(v), _time_major(g), _new_run(run))
    state, o = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(o, 0, 2), state


def gated_delta_recurrent(q, k, v, g, beta, run, state):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, written as
    decay, predict, correct: D = alpha S; S = D + beta k (v - D^T k)^T. o_t = S_t^T q_t."""

    def step(s, x):
        q_t, k_t, v_t, g_t, b_t, reset = x
        s = jnp.where(reset[:, None, None, None], 0.0, s)
        s = jnp.exp(g_t)[..., None, None] * s
        err = v_t - einsum("bhf,bhfd->bhd", k_t, s)
        s = s + b_t[..., None, None] * (k_t[..., :, None] * err[..., None, :])
        return s, einsum("bhf,bhfd->bhd", q_t, s)

    xs = (_time_major(q), _time_major(k), _time_major(v), _time_major(g), _time_major(beta),
          _new_run(run))
    state, o = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(o, 0, 2), state
