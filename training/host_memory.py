"""Host memory of a training process: keep freed heap memory for the next step.

XLA's CPU runtime takes each step's scratch buffers (tens of MB for a small delta-rule
model) from malloc and frees them at the step's end. glibc serves blocks past its mmap
threshold with fresh mappings and returns freed heap tops to the OS past its trim
threshold, so every step faults the same pages in again: a third of the gated_deltanet
main job's CPU time was the kernel zeroing pages (docs/benchmarks.md, session 13).
Raising both thresholds keeps those buffers in the heap between steps.

Threads other than the main one allocate from their own arenas, heaps of up to 64 MiB
each. glibc unmaps an arena's whole extra heap once it is free and trims its top by its
top pad, neither bounded by the trim threshold, so a step whose buffers spill into a
second heap mapped, grew (mprotect) and unmapped it every step: ~95 mprotect calls a
step, and in some processes all of the step's scratch faulted in again (16 M minor
faults in one main job against 0.2-1.4 M). A top pad of one heap's size keeps them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 256 << 20,
                      trim_threshold: int = 512 << 20, top_pad: int = 64 << 20) -> bool:
    """Serve blocks up to mmap_threshold bytes from the heap, keep up to trim_threshold
    freed bytes mapped, and top_pad bytes free at every heap's top (glibc's mallopt).
    Returns whether it applied: False off Linux or without glibc (musl, other
    allocators), where nothing changes.
    Call it at process start, before the large allocations."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))
                and mallopt(_M_TRIM_THRESHOLD, int(trim_threshold))
                and mallopt(_M_TOP_PAD, int(top_pad)))
