"""Model FLOPs per token and model FLOPs utilisation (MFU).

Convention (nanoGPT's / PaLM's, with seed 000's per-mixer cost model):
  training FLOPs per token = 3 x (forward FLOPs), forward = 2 * N_params
      + sum over layers of the mixer's sequence-mixing FLOPs per token.
  * N_params counts every parameter, embeddings included (as nanoGPT's estimate_mfu).
  * softmax attention: 4 * T * d_model per token per layer (2 T d for the scores, 2 T d
    for the weighted values), counted as if non-causal (nanoGPT's 12 L d T = 3 x 4 L d T);
    a sliding window of W uses min(T, W) in place of T.
  * linear mixers (recurrent form): per head, a state write (2 F Dv) and a read (2 F Dv):
    4 * H * F * Dv per token per layer, F the feature dimension, Dv the value width.
The peak is per device and dtype from a small table; CPU has no meaningful peak, so a
nominal 1e11 FLOP/s per CPU device is used (stated wherever MFU is printed).
"""
from __future__ import annotations

from typing import Any, Mapping

import jax

from models.feature_maps import taylor_symmetric_dim

# Dense peak FLOP/s per device (bf16 tensor cores; float32 uses the TF32 / fp32 figure).
PEAK_FLOPS = {
    ("h200", "bfloat16"): 989e12, ("h200", "float32"): 494e12,
    ("h100", "bfloat16"): 989e12, ("h100", "float32"): 494e12,
    ("a100", "bfloat16"): 312e12, ("a100", "float32"): 156e12,
    ("tpu v5 lite", "bfloat16"): 197e12, ("tpu v5e", "bfloat16"): 197e12,
    ("tpu v5p", "bfloat16"): 459e12, ("tpu v4", "bfloat16"): 275e12,
    ("tpu v6 lite", "bfloat16"): 918e12,
}
CPU_NOMINAL_PEAK = 1e11


def peak_flops_per_device(device=None, precision: str = "float32") -> float:
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "").lower()
    if device.platform == "cpu":
        return CPU_NOMINAL_PEAK
    for (name, dtype), peak in PEAK_FLOPS.items():
        if name in kind and dtype == precision:
            return peak
    for (name, dtype), peak in PEAK_FLOPS.items():  # unknown dtype: the bf16 figure
        if name in kind:
            return peak
    return CPU_NOMINAL_PEAK


def feature_dim(model: Mapping[str, Any], head_dim: int) -> int:
    """F of a linear mixer from its feature map (seed 000 / ANCHORS: Based's Taylor map on
    16-dim projections has 1 + 16 + 256 = 273 features, of which models.feature_maps.
    taylor_symmetric keeps 153, the distinct ones; Hedgehog doubles, Performer uses m)."""
    fmap = str(model.get("feature_map") or "").lower()
    mixer = str(model.get("mixer") or "").lower()
    if fmap == "taylor" or mixer == "based":
        d = int(model.get("feature_dim") or 16)
        return taylor_symmetric_dim(d)
    if fmap == "hedgehog" or mixer == "hedgehog":
        return 2 * int(model.get("feature_dim") or head_dim)
    if fmap in ("performer", "favor", "favor+") or mixer == "performer":
        return int(model.get("num_features") or model.get("feature_dim") or 256)
    return int(model.get("feature_dim") or head_dim)


def mixer_flops_per_token(kind: str, model: Mapping[str, Any], seq_len: int) -> float:
    d = int(model["d_model"])
    heads = int(model["num_heads"])
    head_dim = int(model.get("head_dim") or d // heads)
    if kind == "softmax":
        return 4.0 * seq_len * heads * head_dim
    if kind in ("sliding_window", "swa"):
        window = int(model.get("window") or seq_len)
        return 4.0 * min(seq_len, window) * heads * head_dim
    flops = 4.0 * heads * feature_dim(model, head_dim) * head_dim
    if kind == "based":  # Based adds a sliding-window softmax
        window = int(model.get("window") or 64)
        flops += 4.0 * min(seq_len, window) * heads * head_dim
    return flops


def layer_kinds(model: Mapping[str, Any]) -> list[str]:
    """Which mixer each layer uses (same rule as models.LanguageModel.layer_mixers)."""
    n = int(model["num_layers"])
    pattern = model.get("layer_pattern")
    mixer = str(model.get("mixer", "softmax"))
    if pattern:
        return ["softmax" if c.upper() == "S" else mixer for c in pattern]
    every = int(model.get("softmax_every") or 0)
    return ["softmax" if every > 0 and (i + 1) % every == 0 else mixer for i in range(n)]


def train_flops_per_token(num_params: int, model: Mapping[str, Any], seq_len: int,
                          kinds: list[str] | None = None) -> float:
    kinds = kinds or layer_kinds(model)
    forward = 2.0 * num_params + sum(mixer_flops_per_token(k, model, seq_len) for k in kinds)
    return 3.0 * forward


def mfu(tokens_per_s: float, flops_per_token: float, num_devices: int, peak: float) -> float:
    return tokens_per_s * flops_per_token / (num_devices * peak)
