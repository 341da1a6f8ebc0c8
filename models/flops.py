"""Model FLOPs per token: 2 per weight plus each layer's sequence mixing.

Convention (nanoGPT's / PaLM's, with seed 000's per-mixer cost model):
  training FLOPs per token = 3 x forward; forward = 2 * N_params + the sum over layers of
  the layer's `Mixer.flops_per_token(cfg, seq_len)` (what a mixer costs beyond its
  weights: the attention scores and weighted values, or the recurrent state's write
  and read). N_params counts every parameter, embeddings included (as nanoGPT's
  estimate_mfu). The layer layout is cfg.layer_mixers(), the hybrid's included.
"""
from __future__ import annotations

from models.config import ModelConfig
from models.mixers import get_mixer


def forward_flops_per_token(cfg: ModelConfig, num_params: int, seq_len: int) -> float:
    mixing = sum(get_mixer(name).flops_per_token(cfg, seq_len)
                 for name in cfg.layer_mixers())
    return 2.0 * num_params + mixing


def train_flops_per_token(cfg: ModelConfig, num_params: int, seq_len: int) -> float:
    """Forward and backward (twice the forward's FLOPs)."""
    return 3.0 * forward_flops_per_token(cfg, num_params, seq_len)
