"""The GPU programs lower to Triton on a CPU machine: jit(...).lower(lowering_platforms=
("cuda",)) runs Pallas' Triton lowering (jaxpr -> Triton IR) without a GPU. Interpret
mode (the other kernel tests) checks the numbers but not this step, which fails on
constructs the Triton lowering does not support; a switch that is off by default would
otherwise first fail on a GPU. Each switch on its own, GDN and linear attention, forward
and gradient; the lowered module must name the switch's kernels."""
import re

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


def lowered_text(fn, d=D):
    q = jax.random.normal(jax.random.PRNGKey(0), (B, T, H, d), jnp.bfloat16)
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


SEQUENTIAL = ("linear_chunk_fwd", "linear_chunk_fwd_states", "linear_chunk_bwd_dstate")


@pytest.mark.parametrize("op", ["gdn", "linear"])
def test_sequential_kernels_take_two_stages_past_128_keys(op, monkeypatch):
    """Each pipeline stage of the sequential kernels buffers the chunk's C x K tiles: at
    K = 256 three stages asked an H200 for 249,856-258,048 bytes of shared memory (it has
    232,448), so they run at two there and keep SEQ_STAGES (3) at K <= 128."""
    monkeypatch.setattr(common, "interpret", lambda: False)
    fn = _ops()[op]
    for d, want in ((128, recurrence.SEQ_STAGES), (256, 2)):
        texts = [lowered_text(fn, d), lowered_text(jax.grad(
            lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1, 2)), d)]
        stages = {name: int(n) for text in texts
                  for name, n in re.findall(r'name = "(\w+)", num_stages = (\d+)', text)}
        seq = {name: n for name, n in stages.items() if name in SEQUENTIAL}
        assert set(seq) == set(SEQUENTIAL), stages
        assert set(seq.values()) == {want}, (d, seq)
