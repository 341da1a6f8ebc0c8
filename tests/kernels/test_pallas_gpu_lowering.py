"""The GPU programs lower to Triton on a CPU machine: jit(...).lower(lowering_platforms=
("cuda",)) runs Pallas' Triton lowering (jaxpr -> Triton IR) without a GPU. Interpret
mode (the other kernel tests) checks the numbers but not this step, which fails on
constructs the Triton lowering does not support; a switch that is off by default would
otherwise first fail on a GPU. Each switch on its own, GDN and linear attention, forward
and gradient; the lowered module must name the switch's kernels."""
import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from kernels.pallas import common, gdn, intra, recurrence

B, T, H, D, C = 1, 128, 2, 64, 64

# (switch module, attribute, value, kernels the GDN gradient program must contain)
SWITCHES = [
    (None, None, None, ["gdn_chunk_prep_kkt_solve", "gdn_chunk_prep_wu",
                        "linear_chunk_fwd_states", "linear_chunk_fwd_output",
                        "linear_chunk_bwd_dstate", "linear_chunk_bwd_grads",
                        "gdn_chunk_prep_bwd"]),
    (recurrence, "SEQ_SEGMENTS", 2, ["linear_chunk_fwd_segment_maps",
                                     "linear_chunk_bwd_segment_maps"]),
    (intra, "PREP_KERNELS", 1, ["\"gdn_chunk_prep\""]),
    (intra, "PREP_KERNELS", 3, ["\"gdn_chunk_prep_kkt\"", "gdn_chunk_prep_solve",
                                "gdn_chunk_prep_wu"]),
    (intra, "DIAG_INVERSE", "rows", ["gdn_chunk_prep_kkt_solve"]),
    (intra, "SOLVE_PRECISION", "highest", ["gdn_chunk_prep_kkt_solve"]),
    (recurrence, "SPLIT_FWD", "never", ["\"linear_chunk_fwd\""]),
    (gdn, "FUSED_VJP", False, ["gdn_chunk_prep_bwd"]),
]


def _ops():
    def gated(q, k, v, g, beta):
        return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=C, variant="gpu")

    def linear(q, k, v, g, beta):
        return kp.linear_attention(q, k, v, normalize=True, log_decay=g, chunk_size=C,
                                   variant="gpu")
    return {"gdn": gated, "linear": linear}


def lowered_text(fn):
    q = jax.random.normal(jax.random.PRNGKey(0), (B, T, H, D), jnp.bfloat16)
    g = jnp.full((B, T, H), -0.01, jnp.float32)
    beta = jnp.full((B, T, H), 0.5, jnp.float32)
    traced = jax.jit(fn).trace(q, q, q, g, beta)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: f"{s[1]}={s[2]}" if s[1] else "default")
@pytest.mark.parametrize("op", ["gdn", "linear"])
def test_gpu_programs_lower_to_triton(switch, op, monkeypatch):
    module, attr, value, kernels = switch
    monkeypatch.setattr(common, "interpret", lambda: False)   # the compiled path
    if module is not None:
        monkeypatch.setattr(module, attr, value)
    fn = _ops()[op]
    fwd = lowered_text(fn)
    grad = lowered_text(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)),
                                 argnums=(0, 1, 2)))
    assert "linear_chunk" in fwd and "linear_chunk" in grad
    if op == "gdn":
        missing = [name for name in kernels if name not in grad]
        assert not missing, missing
