"""Convert into lightning attention (MiniMax-01): qkv_proj = [q | k | v] and out_proj = o
of the softmax layer; stage 1 trains the output gate and norm on the output MSE; stage
2 fine-tunes all.

    python -m training.convert --config=configs/convert_lightning.py \\
        --workdir=runs/convert_lightning --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, mixer="lightning", loss="output_mse",
                                   stage1_lr=3e-3)
