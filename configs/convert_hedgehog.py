"""Linearize a trained softmax model into Hedgehog layers (Zhang et al. 2024): every
softmax layer becomes hedgehog (fla's softmax map, RoPE kept before it as LoLCATs
does), initialised from its q/k/v/o projections; stage 1 trains only the feature maps
on Hedgehog's attention-weight cross-entropy against the frozen softmax layers; stage 2
fine-tunes every parameter on next-token loss.

    python -m training.convert --config=configs/convert_hedgehog.py \\
        --workdir=runs/convert_hedgehog --config.convert.teacher=runs/shakespeare_gpu

The budget: 250 + 250 steps of 64 x 256 tokens, 8.2M tokens, 10% of
configs/shakespeare_char_gpu.py's 5,000 steps. `:tiny` is a CPU-sized run.
The other recipes (configs/convert_*.py) are this one with a few keys changed.
"""
import ml_collections
from ml_collections import config_dict

from configs import base

# ModelConfig keys a conversion may set on the student (training.convert_init.
# STUDENT_KEYS); None keeps the teacher's value. dropout is stage 2's (stage 1 runs
# without it).
_STUDENT_KEYS = {"hedgehog_map": str, "feature_map": str, "feature_rope": bool,
                 "window": int, "based_feature_dim": int, "num_random_features": int,
                 "performer_redraw_every": int, "performer_qk_norm": bool,
                 "short_conv": bool, "conv_size": int, "impl": str, "chunk_size": int,
                 "remat": bool, "remat_policy": str, "dropout": float}


def recipe(arg=None, *, mixer="hedgehog", loss="attention_ce", stage2="full",
           stage1_lr=1e-2, stage2_lr=3e-4, **model):
    c = base.get_config()
    c.model = ml_collections.ConfigDict(
        {k: config_dict.placeholder(t) for k, t in _STUDENT_KEYS.items()})
    for k, v in model.items():
        c.model[k] = v
    c.convert = ml_collections.ConfigDict(dict(
        teacher=config_dict.placeholder(str),   # a train.py workdir or an HF folder
        teacher_step=config_dict.placeholder(str),  # latest (default) | best | N
        mixer=mixer,
        layers="all",            # or a pattern: "mixer,keep" keeps every other layer
        loss=loss,               # attention_ce (Hedgehog) | output_mse (LoLCATs)
        stage1_params="",        # name fragments replacing the mixer's default choice
        stage1_steps=250, stage1_lr=stage1_lr, stage1_warmup_steps=20,
        stage2=stage2,           # full | lora | none
        stage2_steps=250, stage2_lr=stage2_lr, stage2_warmup_steps=20,
        lora_rank=8, lora_alpha=16.0,
        lora_targets="q_proj,k_proj,v_proj,o_proj,qkv_proj,out_proj",
        stage2_train_new=False,  # lora: also train stage 1's new parameters
        data_from_teacher=True,  # a workdir teacher: its own data section
        report_batches=4,        # eval batches of the per-layer agreement report
        export=True,
    ))
    c.data.tokenizer = "char"
    c.data.seq_len = 256
    c.data.val_fraction = 0.1
    c.train.update(dict(batch_size=64, log_every=10, eval_every=50, eval_batches=20,
                        checkpoint_every=100, weight_decay=0.0, b2=0.99, grad_clip=1.0,
                        prng_impl="unsafe_rbg"))
    if arg == "tiny":  # a CPU run of a few minutes
        c.convert.update(dict(stage1_steps=60, stage2_steps=60, report_batches=2))
        c.train.update(dict(batch_size=8, eval_every=20, eval_batches=4,
                            checkpoint_every=20, log_every=10, prng_impl="threefry2x32"))
    return c


def get_config(arg=None):
    return recipe(arg, feature_rope=True, hedgehog_map="softmax")
