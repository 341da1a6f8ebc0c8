"""Defaults for every key an experiment config may set; experiment files override a few.

Every other file in configs/ starts from `base.get_config()`. Keys set to a placeholder
(None) are "unset": the model or data code applies its own default. The config is
locked before use, so a misspelled --config.KEY stops the run with the nearest keys.
"""
import dataclasses

import ml_collections
from ml_collections import config_dict

from models.config import ModelConfig


def model_section() -> ml_collections.ConfigDict:
    """models.ModelConfig's fields with its defaults, so they are stated in one place;
    vocab_size 0 = take the dataset's."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    return ml_collections.ConfigDict(dict(defaults, vocab_size=0))


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = model_section()

    # data.build(cfg_data, seed=train.seed); None = the data package's default.
    c.data = ml_collections.ConfigDict(dict(
        source="files",
        files=config_dict.placeholder(str),
        name=config_dict.placeholder(str),
        subset=config_dict.placeholder(str),
        split=config_dict.placeholder(str),
        val_split=config_dict.placeholder(str),
        text_field=config_dict.placeholder(str),
        tokenizer="byte",
        tokenizer_dir=config_dict.placeholder(str),
        vocab_size=config_dict.placeholder(int),
        seq_len=256,
        val_fraction=config_dict.placeholder(float),
        packing=config_dict.placeholder(str),
        sample_by=config_dict.placeholder(str),
        # Invalid UTF-8 in a text file: "strict" (the default) stops naming the file and
        # line; "replace" reads the bad bytes as U+FFFD.
        encoding_errors=config_dict.placeholder(str),
        max_documents=config_dict.placeholder(int),
        cache_dir=config_dict.placeholder(str),
        data_dir=config_dict.placeholder(str),
        eod=config_dict.placeholder(bool),
        # source=store: a directory from `python -m data.prepare`; batches read ahead.
        store=config_dict.placeholder(str),
        prefetch=config_dict.placeholder(int),
        verify_store=config_dict.placeholder(bool),
        # MQAR (data/mqar.py): an integer, or a list such as [2, 4] (each row draws one);
        # typed `object` so that the command line takes either.
        num_kv_pairs=config_dict.placeholder(object),
        random_non_queries=False,
        mqar_vocab_size=config_dict.placeholder(int),   # wins over vocab_size for MQAR
        power_a=config_dict.placeholder(float),         # query-gap power law exponent
        # NIAH (data/niah.py). niah_depths: a list of fractions in [0, 1], `object` as
        # num_kv_pairs for the command line.
        niah_kind=config_dict.placeholder(str),
        niah_depths=config_dict.placeholder(object),
        num_keys=config_dict.placeholder(int),
        key_vocab=config_dict.placeholder(int),
        key_len=config_dict.placeholder(int),
        num_digits=config_dict.placeholder(int),
        niah_haystack=config_dict.placeholder(str),    # filler | needles (MK-NIAH-2/3)
        num_values=config_dict.placeholder(int),       # values per key (MV-NIAH)
        filler_source=config_dict.placeholder(str),
        filler_vocab=config_dict.placeholder(int),
        # source=mixture (data/mixture.py): a list of sub-configs or a dict of them.
        components=config_dict.placeholder(object),
    ))

    c.train = ml_collections.ConfigDict(dict(
        steps=1000, batch_size=32, seed=0,
        lr=1e-3, min_lr_ratio=0.1, warmup_steps=100,   # linear warmup, cosine to lr*ratio
        weight_decay=0.1, decay_embeddings=True, b1=0.9, b2=0.95, eps=1e-8,
        grad_clip=1.0, grad_accum=1,                    # microbatches per step (a scan)
        # Sets model.dtype (parameters and recurrent states stay float32): "auto" computes
        # in bfloat16 on GPU and TPU and in float32 on CPU; or "float32" | "bfloat16".
        precision="auto",
        remat=config_dict.placeholder(bool),            # sets model.remat
        log_every=10, eval_every=250, eval_batches=20,
        early_stop_patience=0,                          # stop after N evals, no new best
        early_stop_accuracy=0.0,                        # stop once eval accuracy > this
        checkpoint_every=500, keep_checkpoints=3, async_checkpoints=True,
        keep_best=True,                                 # and the lowest-eval-loss step
        # Resume with another seed, lr schedule or data setting (refused otherwise);
        # the change is recorded in WORKDIR/config_history.jsonl.
        allow_config_change=False,
        # Peak FLOP/s per device for MFU; 0: training.flops' table (H100, H200, A100, TPUs),
        # none known on a CPU or another device, and then no MFU is logged.
        peak_flops=0.0,
        # Random-number generator for dropout and init: "threefry2x32" (same bits on every
        # backend), or "unsafe_rbg" / "rbg" (the hardware generator: much faster dropout
        # masks on GPU/TPU, bits differ between backends).
        prng_impl="threefry2x32",
    ))

    # Devices: ("data", "fsdp", "tensor", "sequence"); -1 = the rest of the devices.
    # sequence: context parallelism, each sequence split along time over this many
    # devices (data.seq_len must divide by it); the mixers pass their states between the
    # pieces (kernels.context_parallel, docs/context_parallel.md). 1 = unsplit.
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, sequence=1))

    c.logging = ml_collections.ConfigDict(dict(
        wandb="offline",            # offline | online | disabled; WANDB_MODE overrides
                                    # offline and online, never disabled
        project="linmix", name="",
        progress=True,              # tqdm bar
    ))
    return c
