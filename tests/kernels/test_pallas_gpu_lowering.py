"""The GPU programs lower to Triton on a CPU machine: jit(...).lower(lowering_platforms=
("cuda",)) runs Pallas' Triton lowering (jaxpr -> Triton IR) without a GPU. Interpret
mode (the other kernel tests) checks the numbers but not this step, which fails on
constructs the Triton lowering does not support; a setting other than the default would
otherwise first fail on a GPU. The default and each non-default setting on its own, GDN
and linear attention, forward and gradient; the lowered module must name the kernels."""
import re

import pytest

import jax
import jax.numpy as jnp

import kernels.pallas as kp
from kernels.pallas import common

B, T, H, D, C = 1, 128, 2, 64, 64

GDN_KERNELS = ["gdn_chunk_prep_kkt_solve", "gdn_chunk_prep_wu", "linear_chunk_fwd_states",
               "linear_chunk_fwd_output", "linear_chunk_bwd_dstate", "linear_chunk_bwd_grads",
               "gdn_chunk_prep_bwd"]
# (name, tuning, kernels the GDN gradient program must contain)
SETTINGS = [
    ("default", kp.DEFAULT_TUNING, GDN_KERNELS),
    ("solve_highest", kp.Tuning(solve_precision="highest"), ["gdn_chunk_prep_kkt_solve"]),
    ("block_v16", kp.Tuning(block_v=16), GDN_KERNELS),
    ("warps", kp.Tuning(seq_warps=8, grads_warps=4, output_warps=8, kkt_solve_warps=2,
                        wu_warps=4, prep_bwd_warps=8, seq_stages=2), GDN_KERNELS),
]


def _ops(tuning):
    def gated(q, k, v, g, beta):
        return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=C, variant="gpu",
                                   tuning=tuning)

    def linear(q, k, v, g, beta):
        return kp.linear_attention(q, k, v, normalize=True, log_decay=g, chunk_size=C,
                                   variant="gpu", tuning=tuning)
    return {"gdn": gated, "linear": linear}


def lowered_text(fn, d=D):
    q = jax.random.normal(jax.random.PRNGKey(0), (B, T, H, d), jnp.bfloat16)
    g = jnp.full((B, T, H), -0.01, jnp.float32)
    beta = jnp.full((B, T, H), 0.5, jnp.float32)
    traced = jax.jit(fn).trace(q, q, q, g, beta)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s[0])
@pytest.mark.parametrize("op", ["gdn", "linear"])
def test_gpu_programs_lower_to_triton(setting, op, monkeypatch):
    _, tuning, kernels = setting
    monkeypatch.setattr(common, "interpret", lambda: False)   # the compiled path
    fn = _ops(tuning)[op]
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
    K = 256 three stages ask an H200 for more shared memory than its 232,448 bytes, so they
    run at two there and keep Tuning.seq_stages (3) at K <= 128."""
    monkeypatch.setattr(common, "interpret", lambda: False)
    fn = _ops(kp.DEFAULT_TUNING)[op]
    for d, want in ((128, kp.DEFAULT_TUNING.seq_stages), (256, 2)):
        texts = [lowered_text(fn, d), lowered_text(jax.grad(
            lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=(0, 1, 2)), d)]
        stages = {name: int(n) for text in texts
                  for name, n in re.findall(r'name = "(\w+)", num_stages = (\d+)', text)}
        seq = {name: n for name, n in stages.items() if name in SEQUENTIAL}
        assert set(seq) == set(SEQUENTIAL), stages
        assert set(seq.values()) == {want}, (d, seq)


def _launch_settings(text):
    """{kernel name: (num_stages, num_warps)} of a lowered module."""
    return {name: (int(stages), int(warps)) for name, stages, warps in re.findall(
        r'name = "(\w+)", num_stages = (\d+) : i32, num_warps = (\d+)', text)}


@pytest.mark.parametrize("tuning,want", [
    (kp.DEFAULT_TUNING, {"gdn_chunk_prep_kkt_solve": (1, 1), "gdn_chunk_prep_wu": (1, 8),
                         "linear_chunk_fwd_states": (3, 4), "linear_chunk_fwd_output": (1, 4),
                         "linear_chunk_bwd_dstate": (3, 4), "linear_chunk_bwd_grads": (1, 8),
                         "gdn_chunk_prep_bwd": (1, 4)}),
    (SETTINGS[-1][1], {"gdn_chunk_prep_kkt_solve": (1, 2), "gdn_chunk_prep_wu": (1, 4),
                       "linear_chunk_fwd_states": (2, 8), "linear_chunk_fwd_output": (1, 8),
                       "linear_chunk_bwd_dstate": (2, 8), "linear_chunk_bwd_grads": (1, 4),
                       "gdn_chunk_prep_bwd": (1, 8)})], ids=["default", "warps"])
def test_tuning_sets_each_kernels_launch(tuning, want, monkeypatch):
    """Each Tuning field reaches the launch of its kernel, and only that one: the GDN
    gradient program's (stages, warps) per kernel, at the default and with every warps
    and stages field changed."""
    monkeypatch.setattr(common, "interpret", lambda: False)
    fn = _ops(tuning)["gdn"]
    text = lowered_text(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)),
                                 argnums=(0, 1, 2)))
    assert _launch_settings(text) == want
