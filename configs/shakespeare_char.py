"""nanoGPT's CPU recipe on character-level tiny-Shakespeare
(config/train_shakespeare_char.py with the README's CPU overrides): 4 layers, 4 heads,
128 wide, context 64, batch 12, 2,000 iterations, lr 1e-3 (warmup 100, cosine to 1e-4),
beta2 0.99, no dropout.
nanoGPT reaches val loss ~1.88.

    python train.py --config=configs/shakespeare_char.py --workdir=runs/shakespeare \\
        --config.data.files=path/to/tinyshakespeare/input.txt
"""
from configs import base


def get_config():
    c = base.get_config()
    c.model.update(dict(d_model=128, num_layers=4, num_heads=4, mixer="softmax",
                        dropout=0.0, tie_embeddings=True, max_len=64))
    c.data.source = "files"
    c.data.tokenizer = "char"            # 65 symbols; first 90% train, last 10% val
    c.data.seq_len = 64
    c.data.val_fraction = 0.1
    c.train.update(dict(steps=2000, batch_size=12, lr=1e-3, min_lr_ratio=0.1,
                        warmup_steps=100, weight_decay=0.1, b1=0.9, b2=0.99, grad_clip=1.0,
                        log_every=50, eval_every=250, eval_batches=20,
                        checkpoint_every=500))
    return c
