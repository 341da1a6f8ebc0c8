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
    assert flops.mfu(1000.0, 1e6, 2, 1e10) == pytest.approx(0.05)
    assert flops.peak_flops_per_device() == flops.CPU_NOMINAL_PEAK  # this machine
