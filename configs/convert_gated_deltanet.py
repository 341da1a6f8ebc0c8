"""Convert every softmax layer into Gated DeltaNet: q/k/v/o from the softmax layer,
short convs at the identity; stage 1 trains the gates, decays, convs and output norm on
the output MSE; stage 2 fine-tunes all.

    python -m training.convert --config=configs/convert_gated_deltanet.py \\
        --workdir=runs/convert_gdn --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, mixer="gated_deltanet", loss="output_mse",
                                   stage1_lr=3e-3)
