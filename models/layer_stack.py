"""Scanned layers: the repeating group of a model's layers, and the two parameter layouts.

A model whose layers repeat a group of `period` layers (all layers alike: period 1; a
7+1 hybrid: period 8) `repeats` times can hold each group position's parameters stacked
on a leading "layers" axis and run the groups under one `lax.scan`; XLA then compiles
the group once instead of every layer (MaxText's scan_layers).

Layouts, as flat parameter names:
  unrolled  "blocks/{i}/mixer/q_proj/kernel"        layer i's array
  stacked   "scan_blocks/{j}/mixer/q_proj/kernel"   (repeats, ...): index r is layer
                                                     i = r * period + j
The converters here are pure functions of the names; `convert` maps a flat dict of one
layout onto the other, so a checkpoint of either layout loads into a model of either.
"""
from __future__ import annotations

import re
from typing import Callable, Collection, Mapping, Sequence

UNROLLED = "blocks"
STACKED = "scan_blocks"
# The logical axis name of the stacked dimension; training.sharding maps it to no mesh
# axis (every device holds all layers of its shard), as MaxText does by default.
LAYER_AXIS = "layers"

_NAME = re.compile(r"^(blocks|scan_blocks)/(\d+)/(.*)$")


def group_period(mixers: Sequence[str]) -> int:
    """The smallest p dividing len(mixers) with mixers[i] == mixers[i % p] for all i."""
    n = len(mixers)
    for p in range(1, n + 1):
        if n % p == 0 and all(mixers[i] == mixers[i % p] for i in range(n)):
            return p
    return n


def scan_shape(mixers: Sequence[str], scan_layers: bool) -> tuple[int, int] | None:
    """(period, repeats) when the model runs stacked, else None (unrolled). A single
    group (no period shorter than the model, e.g. an 8-layer 7+1 hybrid) stays
    unrolled: a scan of one step compiles the same program with extra names."""
    if not scan_layers:
        return None
    period = group_period(mixers)
    repeats = len(mixers) // period
    return (period, repeats) if repeats > 1 else None


def _split(name: str):
    m = _NAME.match(name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else (None, None, name)


def is_stacked(names: Collection[str]) -> bool:
    return any(_split(n)[0] == STACKED for n in names)


def _count(names: Collection[str], kind: str) -> int:
    """How many distinct layer (or group position) indices of `kind` the names hold."""
    return len({i for k, i, _ in map(_split, names) if k == kind})


def stacked_period(names: Collection[str]) -> int:
    """The group period of a stacked layout (0 for an unrolled one)."""
    return _count(names, STACKED)


def unrolled_name(stacked: str, repeat: int, period: int) -> str:
    """The unrolled name of index `repeat` of a stacked array (other names unchanged)."""
    kind, j, rest = _split(stacked)
    if kind != STACKED:
        return stacked
    return f"{UNROLLED}/{repeat * period + j}/{rest}"


def layout_map(source: Collection[str], target: Collection[str]) -> dict:
    """How each target name is made from source names: ("same", name),
    ("stack", [names of repeats 0, 1, ...]) or ("take", name, repeat). Both layouts
    alike: every source name as it is. A target whose source names are missing is left
    out, and a source name no target uses is kept as it is, so a model that does not
    fit its checkpoint still shows as names missing or extra (training.checkpoint's
    check_compatible names them)."""
    source = set(source)
    if is_stacked(source) == is_stacked(target):
        return {n: ("same", n) for n in source}
    out, used = {}, set()
    if is_stacked(target):  # unrolled -> stacked
        period = stacked_period(target)
        repeats = _count(source, UNROLLED) // period
        for name in target:
            kind, _, _ = _split(name)
            if kind == STACKED:
                how = ("stack", [unrolled_name(name, r, period) for r in range(repeats)])
            else:
                how = ("same", name)
            needs = how[1] if how[0] == "stack" else [how[1]]
            if set(needs) <= source:
                out[name] = how
                used.update(needs)
    else:  # stacked -> unrolled
        period = stacked_period(source)
        for name in target:
            kind, i, rest = _split(name)
            how = (("take", f"{STACKED}/{i % period}/{rest}", i // period)
                   if kind == UNROLLED else ("same", name))
            if how[1] in source:
                out[name] = how
                used.add(how[1])
    for name in source - used:
        out.setdefault(name, ("same", name))
    return out


def convert(flat: Mapping[str, object], target: Collection[str], *,
            stack: Callable[[list], object], take: Callable[[object, int], object]) -> dict:
    """`flat` (either layout) in the layout of the names `target`. `stack` joins the
    repeats' leaves on a new leading axis and `take(leaf, r)` reads repeat r, so the
    same map serves arrays, shapes and abstract arrays."""
    out = {}
    for name, how in layout_map(flat.keys(), target).items():
        if how[0] == "same":
            out[name] = flat[how[1]]
        elif how[0] == "stack":
            out[name] = stack([flat[n] for n in how[1]])
        else:
            out[name] = take(flat[how[1]], how[2])
    return out


def convert_arrays(flat: Mapping[str, object], target: Collection[str]) -> dict:
    """Arrays converted (jnp.stack / indexing): exact, no arithmetic."""
    import jax.numpy as jnp
    return convert(flat, target, stack=jnp.stack, take=lambda a, r: a[r])


def convert_shapes(shapes: Mapping[str, tuple], target: Collection[str]) -> dict:
    """Shapes converted; a layer beyond a stacked source's repeats is left out (so a
    deeper model shows as parameters missing from the checkpoint)."""
    out = convert(shapes, target, stack=lambda s: (len(s),) + tuple(s[0]),
                  take=lambda s, r: tuple(s)[1:] if r < s[0] else None)
    return {k: v for k, v in out.items() if v is not None}
