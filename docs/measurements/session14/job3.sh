#!/usr/bin/env bash
# Issue 16, H200 call 3: train.py's own first step (compilation included) at d1024 T2048
# B4 8 layers bf16, softmax then gated_deltanet, each process alone on the machine, no
# compilation cache (scripts/train_speed.py's first_step_s; 20 steps).
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 250 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 20
