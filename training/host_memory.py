"""Host memory of a training process: keep freed heap memory for the next step.

XLA's CPU runtime takes each step's scratch buffers (tens of MB for a small delta-rule
model) from malloc and frees them at the step's end. glibc serves blocks past its mmap
threshold with fresh mappings and returns freed heap tops to the OS past its trim
threshold, so every step faults the same pages in again: a third of the gated_deltanet
main job's CPU time was the kernel zeroing pages (docs/benchmarks.md, session 13).
Raising both thresholds keeps those buffers in the heap between steps.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 256 << 20,
                      trim_threshold: int = 512 << 20) -> bool:
    """Serve blocks up to mmap_threshold bytes from the heap and keep up to
    trim_threshold freed bytes mapped (glibc's mallopt). Returns whether it applied:
    False off Linux or without glibc (musl, other allocators), where nothing changes.
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
                and mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))
