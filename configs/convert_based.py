"""Convert every softmax layer into `based` (Taylor linear attention plus the teacher's
own softmax over a 64-token window, summed): the window starts as the teacher's layer
exactly, the Taylor part from the first 16 dims of each head's q, k and a zero output
projection; stage 1 trains the Taylor part on the output MSE, stage 2 fine-tunes all.

    python -m training.convert --config=configs/convert_based.py \\
        --workdir=runs/convert_based --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, mixer="based", loss="output_mse",
                                   stage1_lr=3e-3, feature_rope=True)
