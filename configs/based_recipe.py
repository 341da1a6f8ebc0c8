"""The Based language model's layer recipe (Arora et al. 2024, HazyResearch/based
train/configs/experiment/reference/based-360m.yaml), beside the one-mixer `based`:

  mixer (every layer not listed)  BaseConv of based/models/mixers/convolution.py: our
                                  `gated_conv` (in_proj 4 d, silu(conv3) gate, out_proj)
  alt_mixer   at 1, 6, 11, 16, 21 LinearAttention with TaylorExp, feature_dim 16: `taylor`
  alt_mixer_2 at 2, 7, 12, 17, 22 SlidingAttention, window_size 256: `sliding_window`

i.e. the group (gated_conv, taylor, sliding_window, gated_conv, gated_conv) five times,
then two more gated_conv layers: 27 layers, SwiGLU MLPs of 2 d (n_inner), d 1024, 16
heads. Based's Taylor layers have no short conv of their own (its LinearAttention and
fla's BasedLinearAttention project straight into the feature map): the short
convolutions of the recipe are its BaseConv layers, so model.short_conv stays off.
The repository's `based` mixer (Taylor + a 64-token window summed in every layer) is
another, compact model; this file is the paper's.

    python train.py --config=configs/based_recipe.py --workdir=runs/based_recipe \\
        --config.data.files='corpus/*.txt'                 # 10 layers, d 256, CPU-sized
    python train.py --config=configs/based_recipe.py:360m ...    # the paper's 360M layout
"""
from configs import lm_files
from models import mixers

# One period of based-360m's layout (its alt_mixer_layers and alt_mixer_2_layers).
GROUP = (mixers.GATED_CONV, mixers.TAYLOR, mixers.SLIDING_WINDOW, mixers.GATED_CONV,
         mixers.GATED_CONV)


def based_pattern(num_layers: int) -> str:
    """GROUP repeated, the layers after the last whole period BaseConv (27: 5 x 5 + 2)."""
    periods, rest = divmod(num_layers, len(GROUP))
    names = [",".join(GROUP)] * periods + ([f"{rest}*{mixers.GATED_CONV}"] if rest else [])
    return ",".join(names)


def get_config(arg: str = ""):
    c = lm_files.get_config()
    if arg == "360m":
        c.model.update(dict(d_model=1024, num_heads=16, num_layers=27, d_ff=2048,
                            layer_pattern=based_pattern(27), window=256,
                            based_feature_dim=16, gated_conv_expand=4, base_conv_size=3,
                            max_len=2048))
        c.data.seq_len = 2048
        # based-360m.yaml's optimiser: AdamW lr 8e-4, betas (0.9, 0.95), wd 0.1, 200
        # warmup steps, cosine to 8e-5 at 20,000 steps.
        c.train.update(dict(steps=20000, lr=8e-4, min_lr_ratio=0.1, warmup_steps=200,
                            b1=0.9, b2=0.95, weight_decay=0.1))
    elif arg:
        raise ValueError(f"configs/based_recipe.py: unknown variant {arg!r}; use no "
                         f"argument (10 layers, d 256) or :360m")
    else:
        c.model.update(dict(d_model=256, num_heads=4, num_layers=10, d_ff=512,
                            layer_pattern=",".join(GROUP), window=64,
                            based_feature_dim=16, gated_conv_expand=4, base_conv_size=3))
    return c
