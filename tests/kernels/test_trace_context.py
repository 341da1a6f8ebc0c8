"""Lowering the Pallas GPU programs leaves jit's tracing context as it was. Pallas' Triton
lowering imports its fuser lazily (jax 0.11), whose config option joins the tracing
context when it is defined; on the H200 that happened inside the first train step's
trace, and every jit cache missed once afterwards (the step traced and compiled twice,
20 s at d1024). kernels.ops imports the kernels and the fuser before anything is traced."""
import importlib
import sys

import jax
import jax.numpy as jnp

from kernels import ops  # noqa: F401  (the import under test)
from kernels.pallas import common


def test_pallas_fuser_is_imported_with_the_kernels():
    if importlib.util.find_spec("jax.experimental.pallas.fuser") is None:
        return  # a jax without the fuser has nothing to import late
    assert "jax.experimental.pallas.fuser" in sys.modules


def test_lowering_a_gpu_program_does_not_retrace_jitted_functions(monkeypatch):
    traces = []

    @jax.jit
    def add_one(x):
        traces.append(None)
        return x + 1

    add_one(jnp.ones(3))
    monkeypatch.setattr(common, "interpret", lambda: False)  # the compiled (Triton) path
    import kernels.pallas as kp
    q = jnp.ones((1, 64, 1, 16), jnp.bfloat16)
    g = jnp.full((1, 64, 1), -0.01, jnp.float32)
    beta = jnp.full((1, 64, 1), 0.5, jnp.float32)

    def loss(q, k, v):
        o = kp.gated_delta_rule(q, k, v, g, beta, chunk_size=16, variant="gpu")
        return jnp.sum(o.astype(jnp.float32))
    jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, q, q).lower(lowering_platforms=("cuda",))
    add_one(jnp.ones(3))
    assert len(traces) == 1
