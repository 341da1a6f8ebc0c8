"""Convert into elu+1 linear attention (with RoPE before the map): the map has no
parameters, so stage 1 trains the q and k projections on the attention cross-entropy.

    python -m training.convert --config=configs/convert_linear.py \\
        --workdir=runs/convert_linear --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, mixer="linear", loss="attention_ce",
                                   stage1_lr=1e-3, feature_map="elu", feature_rope=True)
