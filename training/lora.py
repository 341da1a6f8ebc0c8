"""LoRA (Hu et al. 2021) on a flat parameter dict: W + (alpha / r) A B for chosen kernels.

The adapters live beside the parameters, under "lora/<kernel name>/a" (d_in, r) and
".../b" (r, d_out); `merge` folds them into the kernels before the model is built, so
the model code knows nothing of LoRA and the merged parameters export as any model's.
B starts at zero (the model starts as it was), A ~ N(0, 1/d_in) (a Kaiming-like scale).
A small module of our own: the JAX LoRA libraries on PyPI (jax-lorax 0.3.1, 2024, on
qax's implicit arrays; mlorax 0.9.5, 2024, Flax Linen modules) are unmaintained or
Linen-only, while a flat {name: array} dict makes LoRA three functions.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import jax
import jax.numpy as jnp

PREFIX = "lora/"


def targets(names: Iterable[str], fragments: Iterable[str]) -> list[str]:
    """The 2-d kernels among `names` inside a mixer whose module name is one of
    `fragments` (e.g. q_proj, o_proj): ".../mixer/q_proj/kernel",
    ".../mixer/window/q_proj/kernel"."""
    frags = {f.strip() for f in fragments if f.strip()}
    out = []
    for name in names:
        parts = name.split("/")
        if parts[-1] == "kernel" and len(parts) >= 2 and parts[-2] in frags \
                and "mixer" in parts:
            out.append(name)
    return sorted(out)


def init(params: Mapping[str, jax.Array], kernels: Iterable[str], rank: int, key) -> dict:
    """{"lora/<k>/a": (d_in, rank) ~ N(0, 1/d_in), "lora/<k>/b": zeros (rank, d_out)}."""
    out = {}
    for j, name in enumerate(sorted(kernels)):
        d_in, d_out = params[name].shape
        a = jax.random.normal(jax.random.fold_in(key, j), (d_in, rank), jnp.float32)
        out[f"{PREFIX}{name}/a"] = a / jnp.sqrt(d_in)
        out[f"{PREFIX}{name}/b"] = jnp.zeros((rank, d_out), jnp.float32)
    return out


def is_lora(name: str) -> bool:
    return name.startswith(PREFIX)


def merge(params: Mapping[str, jax.Array], scale: float) -> dict:
    """The model's parameters with every adapter folded in: W + scale * A @ B
    (scale = alpha / rank); the lora/ entries dropped."""
    out = {k: v for k, v in params.items() if not is_lora(k)}
    for name in {k[len(PREFIX):].rsplit("/", 1)[0] for k in params if is_lora(k)}:
        a, b = params[f"{PREFIX}{name}/a"], params[f"{PREFIX}{name}/b"]
        w = out[name]
        out[name] = (w.astype(jnp.float32) + scale * jnp.matmul(
            a, b, precision=jax.lax.Precision.HIGHEST)).astype(w.dtype)
    return out
