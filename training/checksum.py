"""Checksums of saved arrays: a short hex string per array, the same wherever it lives.

A checkpoint stores one checksum per array beside the arrays (in its meta item), and a
restore recomputes them from what it read: a flipped bit, a file from another step or a
half-written one is caught before the run trains on it.

The checksum is computed by XLA on the arrays where they are (sharded over a mesh, over
several processes), not on a host copy: two uint32 sums over the array's bits, one
weighted by odd position factors (a single flipped bit changes it by odd * 2^k, never
0 mod 2^32) and one of the bits xor a position hash (moved elements change it). Integer
sums mod 2^32 do not depend on the order of the additions, so the value is the same for
any sharding, and a run restored onto another mesh checks the same numbers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _bits(x) -> jax.Array:
    """The array's bits as a flat uint32 vector (narrow types widened, wide ones split)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 8:  # bitcast to a narrower type adds a trailing axis of 2
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    as_uint = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[size]
    return jax.lax.bitcast_convert_type(x, as_uint).astype(jnp.uint32).reshape(-1)


def _fold(x) -> jax.Array:
    bits = _bits(x)
    i = jax.lax.iota(jnp.uint32, bits.size)
    weighted = jnp.sum(bits * (2 * i + 1), dtype=jnp.uint32)
    mixed = jnp.sum(bits ^ (i * jnp.uint32(0x9E3779B9)), dtype=jnp.uint32)
    return jnp.stack([weighted, mixed])


@jax.jit
def _fold_all(leaves):
    return [_fold(x) for x in leaves]


def checksums(tree, prefix: str = "") -> dict[str, str]:
    """{path: hex checksum} for every array leaf of `tree` (paths as jax.tree_util
    writes them, after `prefix`)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    named = [(prefix + jax.tree_util.keystr(path), leaf) for path, leaf in flat
             if hasattr(leaf, "dtype") and hasattr(leaf, "shape")]
    if not named:
        return {}
    sums = [_local(s) for s in _fold_all([leaf for _, leaf in named])]
    return {name: "".join(f"{int(w):08x}" for w in s) for (name, _), s in zip(named, sums)}


def _local(x) -> np.ndarray:
    """A (replicated) result's value on this process: over several processes the
    array is global and only this process's copy can be read."""
    if getattr(x, "is_fully_replicated", False) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(jax.device_get(x))


def first_difference(saved: dict[str, str], read: dict[str, str]) -> str | None:
    """The first array whose checksum differs (or is missing on one side), else None."""
    for name in sorted(set(saved) | set(read)):
        if saved.get(name) != read.get(name):
            return name
    return None
