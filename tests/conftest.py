"""Shared test setup: the repo root importable, paths to ../shared, XLA set up to compile
the suite's many tiny programs fast.

JAX runs in its default float32; references are float64 NumPy.

Most of the suite's time on a CPU is XLA compiling small programs, many of them the same
program again (every tiny training run, in-process or through train.py, compiles the
same train step). So, for the test session only:
- a persistent compilation cache in a fresh temporary folder (empty at the start of
  every session, removed at its end; train.py subprocesses share it through the
  environment): a program compiled once is loaded, not compiled, by later tests;
- on a CPU-only install, XLA's backend (LLVM) optimisation off: the same HLO passes, the
  same float32 arithmetic to within an ulp (no fast-math either way), compiled in about
  half the time. Every process of a test (train.py subprocesses too, see
  tests/training/conftest.py:env) runs with the same flags, so bitwise comparisons
  between runs compare like with like.
Set JAX_COMPILATION_CACHE_DIR beforehand to use your own cache, or LINMIX_TEST_XLA=0 to
leave XLA at its defaults.

A full garbage collection walks every live object, and late in a session (thousands of
traced and compiled programs) one takes about a second; the checkpoint code collects
after every orbax read and write (training/checkpoint.py), which was a quarter of the
suite's time. So the objects alive when a test starts are frozen (gc.freeze: left out of
collections, never freed while frozen): a collection inside a test walks only what the
test made, and still finds all of that. At each module's start they are unfrozen and
collected once, so nothing an earlier module dropped stays.
"""
import atexit
import gc
import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ../shared is a developer convenience; tests that use it skip where it is absent.
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def _cpu_only() -> bool:
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return True
    plugins = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
               "jax_rocm7_plugin", "libtpu", "jax_plugins")
    return not any(importlib.util.find_spec(p) for p in plugins)


_ON = os.environ.get("LINMIX_TEST_XLA", "1") != "0"
# The flags every process of the test session compiles with (train.py subprocesses too).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0" if _ON and _cpu_only() else ""

if TEST_XLA_FLAGS and TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TEST_XLA_FLAGS).strip()

if _ON and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # Set once per session; a subprocess that imports this module finds it set and
    # neither makes nor removes a folder.
    _cache = tempfile.mkdtemp(prefix="linmix-test-xla-cache-")
    atexit.register(shutil.rmtree, _cache, True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if "jax" in sys.modules:  # imported before this file: its config read the env already
        import jax
        jax.config.update("jax_compilation_cache_dir", _cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(scope="module", autouse=True)
def _collect_once_per_module():
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _older_objects_frozen(_collect_once_per_module):
    gc.freeze()
    yield
