"""Jitted functional wrappers for the model tests: one compile per shape, reused."""
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from models import ModelConfig

# Tiny sizes: d_model 32, 2 heads of 16, windows and chunks smaller than T = 20 so the
# ring buffer wraps and the chunk form spans several (ragged) chunks.
TINY = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=2, window=6,
            num_random_features=32, based_feature_dim=4, chunk_size=8, max_len=32,
            impl="chunk")


def tiny_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**TINY, **overrides})


def close(a, b, tol=1e-4):
    """max |a - b| relative to the scale of a (the spec's decode == forward bound)."""
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    scale = max(1.0, float(jnp.max(jnp.abs(a))))
    err = float(jnp.max(jnp.abs(a - b)))
    assert err <= tol * scale, f"max abs diff {err:.3g} > {tol:g} x scale {scale:.3g}"


@functools.partial(jax.jit, static_argnums=0)
def _call(graphdef, state, x, segment_ids):
    return nnx.merge(graphdef, state)(x, segment_ids=segment_ids)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _method(graphdef, name, state, *args):
    return getattr(nnx.merge(graphdef, state), name)(*args)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _scan_steps(graphdef, name, state, carry, xs):
    """Apply module.<name>(x_t, carry) for every t of xs (B, n, ...); outputs (B, n, ...)."""
    module = nnx.merge(graphdef, state)

    def body(c, x_t):
        y, c = getattr(module, name)(x_t, c)
        return c, y
    carry, ys = jax.lax.scan(body, carry, jnp.swapaxes(xs, 0, 1))
    return jnp.swapaxes(ys, 0, 1), carry


class Functional:
    """A module split once; calls go through shared jitted functions."""

    def __init__(self, module):
        self.module = module
        self.graphdef, self.state = nnx.split(module)

    def __call__(self, x, segment_ids=None):
        return _call(self.graphdef, self.state, x, segment_ids)

    def method(self, name, *args):
        return _method(self.graphdef, name, self.state, *args)

    def steps(self, name, carry, xs):
        return _scan_steps(self.graphdef, name, self.state, carry, xs)
