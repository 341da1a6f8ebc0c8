"""Convert every softmax layer into LoLCATs' layer (`hedgehog_window`: the teacher's own
softmax over the last 64 keys and Hedgehog linear attention over the older ones, one
normaliser): q/k/v/o from the softmax layer, so the window part starts as the teacher
exactly; stage 1 trains the feature maps and window factors on the output MSE (LoLCATs'
attention transfer), stage 2 fine-tunes all (as the other recipes compared here;
configs/convert_lolcats.py is LoLCATs' own, with LoRA).

    python -m training.convert --config=configs/convert_hedgehog_window.py \\
        --workdir=runs/convert_hhw --config.convert.teacher=runs/shakespeare_gpu
"""
from configs import convert_hedgehog


def get_config(arg=None):
    return convert_hedgehog.recipe(arg, mixer="hedgehog_window", loss="output_mse",
                                   window=64)
