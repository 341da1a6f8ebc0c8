"""A byte-level language model of 57M parameters on local text files, for one GPU:
GPT-2 small's width and heads (768, 12) at 8 layers, context 256, batch 64 (16,384 tokens
a step, as configs/shakespeare_char_gpu.py, so the conversion recipes' steps count the
same tokens), nanoGPT's GPT-2 optimizer settings (lr 6e-4, beta2 0.95, weight decay 0.1,
grad clip 1.0, cosine to a tenth), no dropout (a corpus larger than the model's budget
of tokens does not repeat).

    python train.py --config=configs/lm_files_gpu.py --workdir=runs/lm_gpu \\
        --config.data.files='corpus/*.txt'

The teacher of issue 19's larger conversion (docs/results.md section 5).
"""
from configs import base


def get_config():
    c = base.get_config()
    c.model.update(dict(d_model=768, num_layers=8, num_heads=12, mixer="softmax",
                        dropout=0.0, tie_embeddings=True, max_len=256))
    c.data.source = "files"
    c.data.tokenizer = "byte"
    c.data.seq_len = 256
    c.data.val_fraction = 0.05
    c.train.update(dict(steps=2000, batch_size=64, lr=6e-4, min_lr_ratio=0.1,
                        warmup_steps=100, weight_decay=0.1, b1=0.9, b2=0.95, grad_clip=1.0,
                        log_every=10, eval_every=250, eval_batches=50,
                        checkpoint_every=250, prng_impl="unsafe_rbg"))
    return c
