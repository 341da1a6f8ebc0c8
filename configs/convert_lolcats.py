"""LoLCATs' recipe (Zhang et al. 2024, "LoLCATs"): every softmax layer becomes its
hybrid layer (`hedgehog_window`: softmax over the last 64 keys beside Hedgehog linear
attention, one normaliser), the feature maps and window factors trained on the output
MSE against each frozen softmax layer ("attention transfer"), then LoRA (rank 8) on the
attention projections.

    python -m training.convert --config=configs/convert_lolcats.py \\
        --workdir=runs/convert_lolcats --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, mixer="hedgehog_window", loss="output_mse",
                                   stage2="lora", stage2_lr=1e-3, window=64)
