"""MQAR as Zoology's Based-era configs train it: a mixture of settings for training, and
the mean accuracy over seven test settings as the figure of merit (HazyResearch/zoology
at dbcb60d, zoology/experiments/paper_configs/arxiv24_based_figure2/configs.py and
zoology/experiments/mqar_example_configs/original_mqar_configs.py, whose models come
from zoology/experiments/models_repo.py; the trainer zoology/train.py, its data
zoology/data/utils.py).

    python train.py --config=configs/mqar_zoology_based.py --workdir=runs/zb_gdn \\
        --config.model.mixer=gated_deltanet --config.model.num_heads=2
    python -m sweeps.run --config=configs/compare_mqar_zoology.py:based --workdir=runs/zb

Zoology's recipe, and where this file follows it:
- training data, 180k examples a epoch (vocabulary 8,192, a = 0.01, random filler:
  MQARConfig's random_non_queries=True): 100k of (64, 4), 20k each of (128, 8),
  (256, 16), (256, 32), (256, 64). Here each row draws its setting with those weights
  (5:1:1:1:1) and is padded to 256 with masked filler (data/mqar.py); each query's mask
  is 1/kv, so every example counts equally in the loss, as in Zoology's batches of one
  setting each.
- test: 1,000 examples each of (64, 4), (64, 8), (64, 16), (128, 32), (256, 64),
  (512, 128), (1024, 256) (TEST_SETTINGS); Zoology's valid/accuracy is the mean over
  all 7,000 examples, i.e. over the seven settings, which is what it plots and picks the
  lr by. The sweep (configs/compare_mqar_zoology.py:based) measures it as
  `settings_mean` (sweeps.tasks) and judges by it.
- model: as configs/mqar_zoology_paper.py: BaseConv (kernel 3) then the mixer, no MLP,
  LayerNorm, tied head, N(0, 0.02), no position embeddings (max_position_embeddings=0
  throughout the Based-era configs); Based (our `taylor`) with feature_dim 16, the middle
  of Zoology's 8 / 16 / 24.
- optimizer: AdamW (0.9, 0.999), weight decay 0.1, lr over numpy.logspace(-3, -1.5, 4)
  = 1e-3, 3.16e-3, 1e-2, 3.16e-2, no warmup, cosine to 0 over 32 epochs, no clipping,
  float32.
- budget: batch 256 (test batch 32), 32 epochs of 180k = 5.76M examples: 22,500 steps of
  256 here (Zoology: 391 + 4 x 79 = 707 batches an epoch, 22,624 steps).
- state: Zoology logs it at the longest test length, 1,024 (zoology/logger.py), in
  bytes (numbers x 4, zoology/model.py), over both layers (BaseConv + mixer); the sweep
  measures state_size at 1,024 (eval.state_seq_len) and the report adds the bytes.

Where this differs from Zoology (besides the differences configs/mqar_zoology_paper.py
lists: fresh examples each step, a per-step cosine, no decay of norms and biases, no
embedding dropout):
- no stop at accuracy 0.99: Zoology checks it on the seven test settings, which the
  in-training evaluation here does not see (below), so the recipe turns it off.
- Zoology's batches hold one setting each, taken in a fixed order (all of (64, 4), then
  (128, 8), ...: data/utils.py, shuffle=False); ours mix the settings row by row.
- rows of (64, 4) and (128, 8) are computed at length 256 (the padding is masked and,
  the models being causal, unseen: tests/data/test_mqar_settings.py), which costs time,
  not results.
- the in-training evaluation (eval_every) is of held-out rows of the training mixture;
  Zoology evaluates the seven test settings each epoch. The sweep's final numbers are
  the seven settings.
"""
from configs import mqar_zoology_paper

LRS = [1e-3, 3.1622777e-3, 1e-2, 3.1622777e-2]  # numpy.logspace(-3, -1.5, 4)
# [seq_len, kv, weight]: the weight is Zoology's example count / 20k
TRAIN_SETTINGS = [[64, 4, 5], [128, 8, 1], [256, 16, 1], [256, 32, 1], [256, 64, 1]]
TEST_SETTINGS = [(64, 4), (64, 8), (64, 16), (128, 32), (256, 64), (512, 128), (1024, 256)]
TEST_EXAMPLES = 1_000  # per test setting
STATE_SEQ_LEN = max(t for t, _ in TEST_SETTINGS)


def get_config():
    c = mqar_zoology_paper.get_config()
    c.model.update(dict(based_feature_dim=16))
    c.data.update(dict(seq_len=256, num_kv_pairs=[list(s) for s in TRAIN_SETTINGS],
                       random_non_queries=True))
    c.train.update(dict(steps=22_500, lr=LRS[1], eval_every=2_500, eval_batches=8,
                        checkpoint_every=2_500, early_stop_accuracy=0.0))
    return c
