#!/usr/bin/env bash
# Session 28, GPU call 1 (issue 18), three lanes on one GPU:
#  - new cells of the Zoology paper recipe (4 lrs x 3 seeds, 1,955 steps, stop at 0.99):
#    lightning d256, hedgehog_window d64 / d128, hedgehog_distill d128, then the sliding
#    window's windows 16 and 32 at d128 if time is left;
#  - seeds 3-8 at lr 1e-2 (the best lr) of two cells whose seeds ended below the stop,
#    lightning d64 and linear d64: do new seeds land in the published 3-seed intervals,
#    and what do 9 seeds say.
#   carry: .whl     results: $OUT/sweeps.tgz (runs/h200/{zoology_paper,newseeds}, logs)
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
P="configs/compare_mqar_zoology.py:paper"
F="--config.overrides.train.steps=1955 --yes"
NEW="--config.seeds=(3,4,5,6,7,8) --config.lrs=(0.01,)"
bash sweeps/h200_sweeps.sh \
  "0 zoology_paper $P 330 565 --only=__lightning__d256__,__hedgehog_window__d64__ $F" \
  "0 zoology_paper $P 330 565 --only=__hedgehog_window__d128__,__hedgehog_distill__d128__ $F" \
  "0 newseeds $P 250 565 --only=__lightning__d64__,__linear__d64__ $NEW $F ; zoology_paper $P 330 565 --only=__sliding_window__d128_w16__,__sliding_window__d128_w32__ $F"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
