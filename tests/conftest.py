"""Shared test setup: the repo root importable, paths to ../shared.

JAX runs in its default float32; references are float64 NumPy.
"""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ../shared is a developer convenience; tests that use it skip where it is absent.
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
