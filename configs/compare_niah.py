"""Needle in a haystack: 8-layer models trained at length 512 on text mixed with passkey
and multi-key needles; exact match by depth x length for lengths 512..4096.

    python -m eval.compare --config=configs/compare_niah.py --workdir=runs/cmp_niah
    python -m eval.compare --config=configs/compare_niah.py:tiny ...   # CPU check

Heatmap per mixer (depth x length) and a summary table (mean exact match over the grid).
"""
import ml_collections

MIXERS = ["softmax", "gated_deltanet", "deltanet", "based", "linear", "sliding_window",
          "lightning"]


def _mixer(name, mixer, **extra):
  o = {"model.mixer": mixer}
  o.update({f"model.{k}": v for k, v in extra.items()})
  return {"name": name, "overrides": o}


def get_config(arg: str = ""):
  c = ml_collections.ConfigDict()
  c.title = "Needle in a haystack (passkey): exact match"
  c.task = "niah"
  c.base_config = "configs/niah.py"
  c.lr_key = "train.lr"
  c.seed_key = "train.seed"
  c.overrides = {"model": {"num_layers": 8, "d_model": 256, "num_heads": 4},
                 "data": {"seq_len": 512},
                 "train": {"steps": 3000, "batch_size": 32},
                 "logging": {"wandb": "disabled"}}
  c.settings = [{"name": "L512", "overrides": {}}]
  c.mixers = ([_mixer(m, m) for m in MIXERS]
              + [_mixer("hybrid", "gated_deltanet", softmax_every=8)])
  c.sizes = [{"name": "d256", "overrides": {}}]
  c.lrs = [1e-3]
  c.seeds = [0]
  # lengths 1x..8x the training length, 6 depths in [0, 1]
  c.eval = {"batch_size": 8, "niah": {"length_multiples": (1, 2, 4, 8), "num_depths": 6,
                                      "num_examples": 32, "batch_size": 8}}
  c.train_timeout_s = 3600
  if arg == "tiny":
    c.overrides.model.num_layers = 1
    c.overrides.model.d_model = 32
    c.overrides.model.num_heads = 2
    c.overrides.data.seq_len = 64
    c.overrides.train.steps = 3
    c.overrides.train.batch_size = 4
    c.mixers = [_mixer("softmax", "softmax"), _mixer("gated_deltanet", "gated_deltanet")]
    c.sizes = [{"name": "d32", "overrides": {}}]
    c.eval = {"batch_size": 4, "niah": {"length_multiples": (1, 2), "num_depths": 3,
                                        "num_examples": 4, "batch_size": 4}}
    c.train_timeout_s = 600
  elif arg:
    raise ValueError(f"compare_niah: unknown variant {arg!r}; use '' or 'tiny'")
  return c
