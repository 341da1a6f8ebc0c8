"""Device peaks and MFU; the FLOPs the loop divides by are the model's own count
(models.flops, tested in tests/models/test_flops.py) for every mixer."""
import pytest

from models import MIXERS, ModelConfig
from models.mixers import PARTS
from models import flops as model_flops
from training import flops


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_loop_flops_are_the_models_count_for_every_mixer(name):
    # What training.loop passes: the parameter count, the model section as a dict, the
    # sequence length and the layer layout.
    cfg = ModelConfig(d_model=64, num_heads=2, num_layers=2, mixer=name)
    n, t = 10_000, 128
    got = flops.train_flops_per_token(n, cfg.to_dict(), t, cfg.layer_mixers())
    assert got == model_flops.train_flops_per_token(cfg, n, t)
    # Token mixing beyond the weights is counted, but for the convolution parts (base_conv,
    # gated_conv), whose every multiply-add is one of a weight's.
    assert got == 6 * n if name in PARTS else got > 6 * n
    assert flops.mfu(1000.0, got, 1, 1e10) == pytest.approx(1000.0 * got / 1e10)


def test_loop_flops_refuse_another_layout():
    cfg = ModelConfig(d_model=64, num_heads=2, num_layers=2, mixer="linear")
    with pytest.raises(ValueError, match="layer mixers"):
        flops.train_flops_per_token(1, cfg.to_dict(), 8, ["softmax", "linear"])


def test_mfu_and_peak():
    """MFU against the table's or the given peak; none where no peak is known (a CPU, a
    device the table lacks), rather than a ratio against a guess."""
    assert flops.mfu(1000.0, 1e6, 2, 1e10) == pytest.approx(0.05)
    assert flops.peak_flops_per_device() is None  # this machine: a CPU
    assert flops.mfu(1000.0, 1e6, 2, None) is None
    assert flops.run_peak(0.0, "float32") is None
    assert flops.run_peak(2e12, "float32") == 2e12
    assert "train.peak_flops" in flops.peak_note(None) and flops.peak_note(2e12) == ""

    class H100:
        platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"

    class L4:
        platform, device_kind = "gpu", "NVIDIA L4"

    assert flops.peak_flops_per_device(H100(), "bfloat16") == 989e12
    assert flops.peak_flops_per_device(H100(), "float32") == 494e12
    assert flops.peak_flops_per_device(L4(), "bfloat16") is None
