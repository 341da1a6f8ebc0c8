"""training.host_memory.keep_freed_memory: a buffer freed and taken again at every step
(as XLA's CPU scratch) stops faulting its pages in again once it applies."""
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import ctypes, resource, sys
    from training import host_memory
    applied = host_memory.keep_freed_memory() if sys.argv[1] == "1" else False
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):       # ten steps: take the buffer, write every page, free it
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(int(applied), faults)
""")


def _faults(apply: str):
    out = subprocess.run([sys.executable, "-c", PROGRAM, apply], capture_output=True,
                         text=True, check=True, cwd=".")
    applied, faults = out.stdout.split()
    return applied == "1", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_step_buffer_is_not_faulted_in_again():
    pages = (64 << 20) // 4096
    applied, kept = _faults("1")
    if not applied:
        pytest.skip("no glibc mallopt here")
    _, plain = _faults("0")
    assert plain >= 8 * pages      # glibc's default: fresh pages at (nearly) every step
    assert kept <= 2 * pages       # kept: the pages fault in once
