"""Device peak FLOP/s and model FLOPs utilisation (MFU).

What a model costs per token is the model's to say (models.flops, from each layer's
mixer); `train_flops_per_token` only takes it the way training.loop holds the model.
The peak is per device and dtype from a small table, or train.peak_flops. A CPU or a
device missing from the table has no known peak, so no MFU is reported there (a guessed
peak printed MFUs of 120% on a 2-core CPU); the run's banner says so once.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax

from models import flops as model_flops
from models.config import ModelConfig

# Dense peak FLOP/s per device (bf16 tensor cores; float32 uses the TF32 / fp32 figure).
PEAK_FLOPS = {
    ("h200", "bfloat16"): 989e12, ("h200", "float32"): 494e12,
    ("h100", "bfloat16"): 989e12, ("h100", "float32"): 494e12,
    ("a100", "bfloat16"): 312e12, ("a100", "float32"): 156e12,
    ("tpu v5 lite", "bfloat16"): 197e12, ("tpu v5e", "bfloat16"): 197e12,
    ("tpu v5p", "bfloat16"): 459e12, ("tpu v4", "bfloat16"): 275e12,
    ("tpu v6 lite", "bfloat16"): 918e12,
}


def peak_flops_per_device(device=None, precision: str = "float32") -> float | None:
    """The table's dense peak FLOP/s of `device` (default: the first) at `precision`;
    None for a CPU or a device the table does not list."""
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "").lower()
    if device.platform == "cpu":
        return None
    for (name, dtype), peak in PEAK_FLOPS.items():
        if name in kind and dtype == precision:
            return peak
    for (name, dtype), peak in PEAK_FLOPS.items():  # unknown dtype: the bf16 figure
        if name in kind:
            return peak
    return None


def run_peak(given: float, precision: str) -> float | None:
    """The peak MFU is taken against: train.peak_flops when set (> 0), else the table's
    figure for this device (None: unknown, so no MFU)."""
    return float(given) if given else peak_flops_per_device(precision=precision)


def peak_note(peak: float | None) -> str:
    """What the banner adds about MFU: nothing when a peak is known."""
    if peak:
        return ""
    kind = jax.devices()[0].device_kind
    return (f" (MFU not reported: no peak FLOP/s known for {kind!r}; set "
            f"train.peak_flops to see it)")


def train_flops_per_token(num_params: int, model: Mapping[str, Any], seq_len: int,
                          kinds: list[str] | None = None) -> float:
    """models.flops.train_flops_per_token of the model section `model` (a dict). `kinds`,
    when given, must be the config's own layer layout: one rule places the layers."""
    cfg = ModelConfig.from_dict(model)
    if kinds is not None and list(kinds) != cfg.layer_mixers():
        raise ValueError(f"layer mixers {list(kinds)} are not the config's "
                         f"{cfg.layer_mixers()}")
    return model_flops.train_flops_per_token(cfg, num_params, seq_len)


def mfu(tokens_per_s: float, flops_per_token: float, num_devices: int,
        peak: float | None) -> float | None:
    """Model FLOPs utilisation; None where the peak is unknown."""
    if not peak:
        return None
    return tokens_per_s * flops_per_token / (num_devices * peak)
