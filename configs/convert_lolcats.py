"""LoLCATs' recipe (Zhang et al. 2024, "LoLCATs"): Hedgehog feature maps trained on the
output MSE against each frozen softmax layer ("attention transfer"), then LoRA (rank 8)
on the attention projections. (LoLCATs' layers also add a sliding window inside the
same normalisation; `configs/convert_based.py` is the nearest here: a window summed
beside a linear part.)

    python -m training.convert --config=configs/convert_lolcats.py \\
        --workdir=runs/convert_lolcats --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, loss="output_mse", stage2="lora", stage2_lr=1e-3,
                                   feature_rope=True, hedgehog_map="softmax")
