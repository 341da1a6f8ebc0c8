"""Shared test setup: float64 on, the repo root importable, paths to ../shared."""
import os
import pathlib
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
jax.config.update("jax_enable_x64", True)

# ../shared is a developer convenience; tests that use it skip where it is absent.
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
