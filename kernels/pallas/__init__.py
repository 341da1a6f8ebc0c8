"""Pallas chunkwise kernels (GPU via Pallas' Triton lowering, TPU via Mosaic) for linear
attention and the gated delta rule, forward and backward. See kernels/README.md.

Called by kernels.ops for impl="pallas" (and impl="auto" on GPU/TPU):
    linear_attention(q, k, v, *, normalize, eps, log_decay, initial_state, return_state,
                     chunk_size, tuning)
    gated_delta_rule(q, k, v, log_alpha, beta, *, initial_state, return_state, chunk_size,
                     tuning)
tuning: a kernels.pallas.Tuning (launch settings of the GPU programs; DEFAULT_TUNING).
and by kernels.ops.conv_silu_norm (the delta rules' conv + SiLU + L2 norm + scale):
    conv_silu_norm(x, kernel, positions, head_dim, normalize, scale, eps, block_t,
                   num_warps)
"""
from kernels.pallas.decode import gated_delta_step, gated_delta_step_pallas
from kernels.pallas.gdn import gated_delta_rule
from kernels.pallas.linear import linear_attention
from kernels.pallas.short_conv import conv_silu_norm
from kernels.pallas.tuning import DEFAULT as DEFAULT_TUNING
from kernels.pallas.tuning import Tuning

__all__ = ["linear_attention", "gated_delta_rule", "conv_silu_norm", "gated_delta_step",
           "gated_delta_step_pallas", "Tuning", "DEFAULT_TUNING"]
