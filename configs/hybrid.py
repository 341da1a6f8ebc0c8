"""The 1-in-8 hybrid (MiniMax-01 style): 8 layers, gated DeltaNet everywhere except layer 8,
which is softmax attention. A byte-level LM on local files, like lm_files.py.

    python train.py --config=configs/hybrid.py --workdir=runs/hybrid --config.data.files=...
    # move the softmax layer: --config.model.layer_pattern=softmax,7*gated_deltanet
"""
from configs import lm_files


def get_config():
    c = lm_files.get_config()
    c.model.update(dict(num_layers=8, mixer="gated_deltanet", softmax_every=8))
    return c
