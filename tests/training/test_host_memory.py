"""training.host_memory.keep_freed_memory: a buffer freed and taken again at every step
(as XLA's CPU scratch) stops faulting its pages in again once it applies."""
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import ctypes, resource, sys, threading
    from training import host_memory
    mode, count, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    in_thread = sys.argv[4] == "1"
    applied = False
    if mode == "all":
        applied = host_memory.keep_freed_memory()
    elif mode == "no_top_pad":  # glibc's default top pad, 128 KiB
        applied = host_memory.keep_freed_memory(top_pad=128 << 10)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    sizes = [kib << 10] * count
    faults = []

    def steps():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):  # ten steps: take the buffers, write every page, free them
            ps = [libc.malloc(size) for size in sizes]
            for p, size in zip(ps, sizes):
                ctypes.memset(p, 1, size)
            for p in reversed(ps):
                libc.free(p)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    if in_thread:  # another thread's arena, as XLA's thread pool's
        worker = threading.Thread(target=steps)
        worker.start()
        worker.join()
    else:
        steps()
    print(int(applied), faults[0])
""")


def _faults(mode: str, count: int = 1, kib: int = 64 << 10, in_thread: bool = False):
    """Minor faults of ten steps that each take `count` buffers of `kib` KiB, write every
    page, and free them; and whether host_memory applied (mode "all")."""
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode, str(count), str(kib),
                          str(int(in_thread))],
                         capture_output=True, text=True, check=True, cwd=".")
    applied, faults = out.stdout.split()
    return applied == "1", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_step_buffer_is_not_faulted_in_again():
    pages = (64 << 20) // 4096
    applied, kept = _faults("all")
    if not applied:
        pytest.skip("no glibc mallopt here")
    _, plain = _faults("none")
    assert plain >= 8 * pages      # glibc's default: fresh pages at (nearly) every step
    assert kept <= 2 * pages       # kept: the pages fault in once


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_thread_arenas_second_heap_is_kept():
    # 1,000 buffers of 100 KiB in a thread's arena: they fill its first 64 MiB heap to
    # within one buffer and spill into a second one, which glibc unmaps once free
    # whatever the trim threshold, unless the top pad holds it.
    spilled_pages = ((1000 * 100 << 10) - (64 << 20)) // 4096
    applied, kept = _faults("all", 1000, 100, in_thread=True)
    if not applied:
        pytest.skip("no glibc mallopt here")
    _, thresholds_only = _faults("no_top_pad", 1000, 100, in_thread=True)
    assert thresholds_only >= 5 * spilled_pages  # the second heap's pages, step after step
    assert kept <= 2 * (1000 * 100 << 10) // 4096  # every page faults in once
