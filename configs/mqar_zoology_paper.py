"""MQAR as the Zoology paper trains it: one setting, (seq_len 256, 16 kv pairs), trained
and tested there (HazyResearch/zoology at dbcb60d,
zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py; the trainer
zoology/train.py, its defaults zoology/config.py).

    python train.py --config=configs/mqar_zoology_paper.py --workdir=runs/zp_gdn \\
        --config.model.mixer=gated_deltanet --config.model.num_heads=2
    python -m training.population --config=configs/mqar_zoology_paper.py \\
        --workdir=runs/zp_softmax --lrs=1e-4,4.6416e-4,2.1544e-3,1e-2 --seeds=0,1,2

Zoology's recipe, and where this file follows it:
- data: vocabulary 8,192, (256, 16), power law a = 0.01, filler 0
  (random_non_queries=False); 100k training examples, 3,000 test examples.
- model: layer 0 BaseConv (kernel 3), layer 1 the mixer (configs/mqar_zoology.py), no
  MLP, LayerNorm (eps 1e-5), Embedding and Linear init N(0, 0.02), tied head, no position
  embeddings (a BaseConv layer before the mixer gives it the order).
- optimizer: AdamW, betas (0.9, 0.999), eps 1e-8, weight decay 0.1, lr over
  numpy.logspace(-4, -2, 4) = 1e-4, 4.64e-4, 2.15e-3, 1e-2 (the sweep,
  configs/compare_mqar_zoology.py), no warmup, cosine to 0 over the 64 epochs, no
  gradient clipping, float32 (Zoology's trainer has no autocast).
- budget: batch 256, 64 epochs of 100k = 6.4M examples: 25,000 steps of 256 here
  (Zoology: 391 batches an epoch, the last of 160, 25,024 steps).
- evaluation: accuracy over the query positions of held-out examples (sweeps evaluate
  3,008, Zoology 3,000); Zoology keeps each point's best of its four lrs.

Where this differs from Zoology:
- fresh examples every step (data.source=mqar: a pure function of (seed, step)), where
  Zoology draws 100k once and repeats them 64 times; the test set is its own stream.
- the cosine is per step; Zoology's steps once an epoch (CosineAnnealingLR, T_max=64).
- the stop at validation accuracy 0.99 (train.early_stop_accuracy) is checked every 391
  steps (Zoology: after every epoch of 391 batches) on 12 x 256 held-out examples.
- the paper's Figure 2 builds attention, Hyena, H3 and RWKV as two layers of the mixer
  itself (attention with learned positions of length 256) and only Based as
  Hybrid([BaseConv, Based]); here every mixer follows BaseConv, the Based-era layout
  (issue 18: Zoology's models as the Based-era configs build them).
- weight decay: ours skips norm gains and biases (training/optim.py); Zoology's AdamW
  decays every parameter.
- dropout: Zoology drops 0.1 of the embeddings only (embed_dropout; resid_dropout 0)
  and 0.1 of the attention weights (MHA dropout); model.dropout here would drop every
  residual branch too, so it stays 0 and only attention_dropout = 0.1 is kept.
- BaseConv's state: ours counts the conv's kernel - 1 = 2 past inputs per channel,
  Zoology's state_size 3 (zoology/mixers/convolution.py); 1 d_model of numbers.
"""
from configs import mqar_zoology

LRS = [1e-4, 4.6415888e-4, 2.1544347e-3, 1e-2]  # numpy.logspace(-4, -2, 4)
# (seq_len, kv) trained and tested; Figure 2's other settings are (64, 4), (128, 8)
SETTING = (256, 16)


def get_config():
    c = mqar_zoology.get_config()
    c.model.update(dict(d_model=128, num_heads=1, num_layers=2, mlp=False,
                        norm="layernorm", norm_eps=1e-5, tie_embeddings=True,
                        positions="none", init_std=0.02, dropout=0.0,
                        attention_dropout=0.1, based_feature_dim=8))
    c.data.update(dict(seq_len=SETTING[0], num_kv_pairs=SETTING[1], vocab_size=8192,
                       power_a=0.01, random_non_queries=False))
    c.train.update(dict(steps=25_000, batch_size=256, lr=LRS[2], warmup_steps=0,
                        min_lr_ratio=0.0, weight_decay=0.1, decay_embeddings=True,
                        b1=0.9, b2=0.999, eps=1e-8, grad_clip=0.0, precision="float32",
                        log_every=100, eval_every=391, eval_batches=12,
                        early_stop_accuracy=0.99,
                        # 2 newest + the best per run: a 12-member d256 population keeps
                        # about 1 GB, a whole 360-run sweep about 20 GB of disk
                        checkpoint_every=2_500, keep_checkpoints=2))
    return c
