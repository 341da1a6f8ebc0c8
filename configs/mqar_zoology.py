"""MQAR in Zoology's layout: every model is Hybrid([BaseConv, mixer]) (HazyResearch/zoology,
zoology/mixers/hybrid.py: layer i runs configs[i % 2]; experiments/models_repo.py builds
each mixer that way with n_layers=2), so layer 0 is Zoology's BaseConv (kernel 3,
models/mixers/base_conv.py) and layer 1 the mixer under test. The rest is configs/mqar.py.

    python train.py --config=configs/mqar_zoology.py --workdir=runs/mqar_zoology_linear \\
        --config.model.mixer=linear
    # two (BaseConv, mixer) pairs: --config.model.num_layers=4

layer_pattern "base_conv,mixer" names cfg.mixer, so --config.model.mixer (and a sweep
over it) keeps the layout; the group repeats to any even num_layers.

Measured on the shared 2-core CPU, 1,500 steps, seed 0 (issue 17): linear reaches eval
accuracy 0.978 here, and 0.981 on configs/mqar.py with --config.model.short_conv=True;
on configs/mqar.py without either it stays at 0.252, the "any value from the context"
floor of 1/4.
"""
from configs import mqar
from models import mixers


def get_config():
    c = mqar.get_config()
    c.model.update(dict(num_layers=2, layer_pattern=f"{mixers.BASE_CONV},mixer"))
    return c
