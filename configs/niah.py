"""Needle in a haystack (passkey, RULER S-NIAH-1 style) trained from scratch.

A haystack of random filler with `[NEEDLE] d1..d5` at a random depth and `[Q]` at the
end; the loss counts only the answer digits, so eval_accuracy is per-digit accuracy.

    python train.py --config=configs/niah.py --workdir=runs/niah \\
        [--config.model.mixer=gated_deltanet]
    # multi-key: --config.data.niah_kind=multikey --config.data.num_keys=8
    # RULER MK-NIAH-2, a haystack of needles: --config.data.niah_kind=multikey
    #     --config.data.niah_haystack=needles --config.data.key_len=2 --config.data.num_digits=7
    # RULER MV-NIAH: --config.data.niah_kind=multikey --config.data.num_keys=1
    #     --config.data.num_values=4 --config.data.num_digits=7
    # real-text haystack: --config.data.files=path/to/text.txt
"""
from ml_collections import config_dict

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(dict(d_model=128, num_layers=2, num_heads=4, mixer="softmax", mlp=True))
    c.data.source = "niah"
    c.data.seq_len = 256
    c.data.tokenizer = "byte"
    c.data.niah_kind = "passkey"           # passkey | multikey
    c.data.num_keys = 4                    # needles in a multikey haystack
    c.data.key_vocab = 64
    c.data.num_digits = 5                  # digits per value (RULER's numbers: 7)
    # data.niah_haystack (filler | needles) and data.num_values (1) are left unset, their
    # defaults, so a run started before they existed resumes with an unchanged config
    c.data.filler_vocab = config_dict.placeholder(int)
    c.train.update(dict(steps=3000, batch_size=32, lr=1e-3, warmup_steps=100, b2=0.99,
                        log_every=50, eval_every=500, eval_batches=8, checkpoint_every=500))
    return c
