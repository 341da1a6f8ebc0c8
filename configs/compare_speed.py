"""Speed: training tokens/s at T = 2,048 and 8,192, decode tokens/s and decode-state bytes
against context length (1K..32K), for softmax (KV cache), gated_deltanet, based and the
1-in-8 hybrid. Nothing is trained; each mixer is timed in-process (eval/speed.py): the
train step train.py runs on batches of the data pipeline (configs/base.py's, the
repository's Markdown as bytes unless `base_config` / `overrides` name other data; see
sweeps/tasks.py), and decoding on random tokens, with random weights (speed does not
depend on their values). Decode batch 64: at
32K the softmax KV cache is 64 x 32K x 8 layers x 2 x 1024 bf16 = 69 GB, which a decode
step must read; set XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 on a 141 GB H200.

    python -m sweeps.run --config=configs/compare_speed.py --workdir=runs/cmp_speed
    python -m sweeps.run --config=configs/compare_speed.py:decode ...  # decode half
    python -m sweeps.run --config=configs/compare_speed.py:train ...   # training half
    python -m sweeps.run --config=configs/compare_speed.py:tiny ...    # CPU check
"""
import ml_collections

from models import mixers


def _mixer(name, mixer, **extra):
    o = {"model.mixer": mixer}
    o.update({f"model.{k}": v for k, v in extra.items()})
    return {"name": name, "overrides": o}


def get_config(arg: str = ""):
    c = ml_collections.ConfigDict()
    c.title = "Speed: training and decode throughput"
    c.task = "speed"
    # The model every mixer shares (a ModelConfig dict): 8 layers, 1024 wide, bf16 compute.
    c.model = {"vocab_size": 256, "d_model": 1024, "num_layers": 8, "num_heads": 8,
               "dtype": "bfloat16", "max_len": 32768 + 64}
    # in order of priority: a sweep cut short by its time budget keeps the first ones
    c.mixers = [_mixer(mixers.SOFTMAX, mixers.SOFTMAX),
                _mixer(mixers.GATED_DELTANET, mixers.GATED_DELTANET),
                _mixer("hybrid", mixers.GATED_DELTANET, softmax_every=8),
                _mixer(mixers.BASED, mixers.BASED)]
    # 32K first: with a time budget, the longest context is the one to keep
    c.speed = {"train_lengths": (2048, 8192), "train_batch": 4, "train_steps": 5,
               "decode_contexts": (32768, 1024, 8192), "decode_batch": 64,
               "decode_tokens": 32}
    if arg in ("decode", "train"):  # one half only: two sweeps, each with its own budget
        c.title = f"Speed: {arg} throughput"
        c.speed["train_lengths" if arg == "decode" else "decode_contexts"] = ()
        if arg == "decode":  # two lengths, 32K first: what a few minutes of one GPU allow
            c.speed["decode_contexts"] = (32768, 2048)
    elif arg == "tiny":
        c.model = {"vocab_size": 64, "d_model": 32, "num_layers": 2, "num_heads": 2,
                   "max_len": 256}
        c.mixers = [_mixer(mixers.SOFTMAX, mixers.SOFTMAX),
                    _mixer(mixers.GATED_DELTANET, mixers.GATED_DELTANET)]
        c.speed = {"train_lengths": (32, 64), "train_batch": 2, "train_steps": 2,
                   "decode_contexts": (16, 64), "decode_batch": 2, "decode_tokens": 4}
    elif arg:
        raise ValueError(f"compare_speed: unknown variant {arg!r}; use '', 'decode', "
                         "'train' or 'tiny'")
    return c
