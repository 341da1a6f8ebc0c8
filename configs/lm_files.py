"""A small byte-level language model on local text files.

    python train.py --config=configs/lm_files.py --workdir=runs/lm \\
        --config.data.files='corpus/*.txt' [--config.model.mixer=gated_deltanet]
"""
from configs import base


def get_config():
    c = base.get_config()
    c.model.update(dict(d_model=256, num_layers=4, num_heads=4, mixer="softmax",
                        max_len=256))
    c.data.source = "files"
    c.data.tokenizer = "byte"
    c.data.seq_len = 256
    c.train.update(dict(steps=2000, batch_size=16, lr=1e-3, warmup_steps=100, b2=0.99,
                        log_every=20, eval_every=250, eval_batches=10,
                        checkpoint_every=250))
    return c
