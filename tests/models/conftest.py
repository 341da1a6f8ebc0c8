"""Model tests compare float32 against float64 references and two code paths against each
other at 1e-4. GPUs default to TF32 matmuls (~1e-3 relative), so run these tests at full
float32 matmul precision (a no-op on CPU, where float32 dots are already exact-rounded)."""
import jax
import pytest


@pytest.fixture(autouse=True)
def _full_float32_matmuls():
    with jax.default_matmul_precision("highest"):
        yield
