"""Character-level tiny-Shakespeare: nanoGPT's GPU recipe for softmax, then every mixer.

    python -m sweeps.run --config=configs/compare_shakespeare.py \
        --workdir=runs/cmp_shakespeare \
        --config.overrides.data.files=path/to/tinyshakespeare/input.txt
    python -m sweeps.run --config=configs/compare_shakespeare.py:tiny \
        --workdir=... --config.overrides.data.files=...   # CPU check
    python -m sweeps.run --config=configs/compare_shakespeare.py:seeds \
        --workdir=... --config.overrides.data.files=... --only=softmax_6L,gated_deltanet_8L

:seeds trains every mixer with seeds 0, 1, 2, the three of a mixer together as one
population (training.population, members vmapped: one model of this size leaves most of
an H200 idle); each member stops by its own patience, as a separate run does.

nanoGPT `config/train_shakespeare_char.py`: 6 layers, 6 heads, 384 wide, context 256,
batch 64, dropout 0.2, lr 1e-3, 5,000 steps (best val loss 1.4697; 1.4612 measured on an
H200). Every other mixer runs at 8 layers, so the 1-in-8 hybrid has its one softmax
layer; softmax at 8 layers is there as the like-for-like baseline.
"""
import ml_collections
from ml_collections import config_dict

from models import mixers

LINEAR = list(mixers.FIXED_STATE)  # every linear (fixed-state) mixer


def _mixer(name, mixer, layers, **extra):
    o = {"model.mixer": mixer, "model.num_layers": layers}
    o.update({f"model.{k}": v for k, v in extra.items()})
    return {"name": name, "overrides": o}


def get_config(arg: str = ""):
    c = ml_collections.ConfigDict()
    c.title = "tiny-Shakespeare (characters): validation loss"
    c.task = "lm"
    c.base_config = "configs/shakespeare_char_gpu.py"  # the recipe; precision bf16 below
    c.lr_key = "train.lr"
    c.seed_key = "train.seed"
    # Every run reports its best validation loss (evaluated every 250 steps). The runs
    # overfit after ~1,000-2,000 steps, so each stops after 6 evaluations (1,500 steps)
    # without a new best: the best is then behind it, and the sweep costs ~40% less.
    c.overrides = {"model": {"d_model": 384, "num_heads": 6, "dropout": 0.2,
                             "attention_dropout": 0.2},
                   "data": {"seq_len": 256, "files": config_dict.placeholder(str)},
                   "train": {"steps": 5000, "batch_size": 64, "precision": "bfloat16",
                             "eval_every": 250, "eval_batches": 50,
                             "checkpoint_every": 1000, "early_stop_patience": 6,
                             "prng_impl": "unsafe_rbg"},
                   "logging": {"wandb": "disabled"}}
    c.settings = [{"name": "char", "overrides": {}}]
    c.mixers = ([_mixer("softmax_6L", mixers.SOFTMAX, 6)]
                + [_mixer("hybrid_8L", mixers.GATED_DELTANET, 8, softmax_every=8)]
                + [_mixer(f"{m}_8L", m, 8) for m in LINEAR]
                + [_mixer("softmax_8L", mixers.SOFTMAX, 8)])
    c.sizes = [{"name": "d384", "overrides": {}}]
    c.lrs = (1e-3,)
    c.seeds = (0,)
    c.eval = {"batch_size": 64, "num_batches": 200}  # nanoGPT: eval_iters 200 x batch 64
    c.train_timeout_s = 3600
    if arg == "tiny":  # CPU check of the machinery: a few steps of a 1-layer model
        c.base_config = "configs/shakespeare_char.py"
        c.overrides.train.precision = "float32"
        c.overrides.train.prng_impl = "threefry2x32"
        c.overrides.train.eval_every = 0
        c.overrides.train.eval_batches = 2
        c.overrides.model.d_model = 32
        c.overrides.model.num_heads = 2
        c.overrides.data.seq_len = 32
        c.overrides.train.steps = 4
        c.overrides.train.batch_size = 4
        c.mixers = [_mixer("softmax_1L", mixers.SOFTMAX, 1),
                    _mixer("gated_deltanet_1L", mixers.GATED_DELTANET, 1)]
        c.sizes = [{"name": "d32", "overrides": {}}]
        c.eval = {"batch_size": 4, "num_batches": 2}
        c.train_timeout_s = 600
    elif arg == "seeds":  # issue 18: 3 seeds a mixer, for intervals
        c.seeds = (0, 1, 2)  # a tuple, so that --config.seeds="(3, 4)" can replace it
        c.population = True
        # --config.population_max_members=6: a cell's members in populations of at most 6,
        # one after another, where all of them at once would not fit in GPU memory
        c.population_max_members = 0
    elif arg:
        raise ValueError(f"compare_shakespeare: unknown variant {arg!r}; use '', 'tiny' "
                         "or 'seeds'")
    return c
