#!/usr/bin/env bash
# Issue 16, H200 call 3: train.py's own first step (compilation included) at d1024 T2048
# B4 8 layers bf16, softmax then gated_deltanet, each process alone on the machine, no
# compilation cache (scripts/train_speed.py's first_step_s; 20 steps), after the Pallas
# entry points went under one jit (one lowering for all layers). First the GDN mixer's
# optimised HLO at T2048 for the next session's fusion work.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 40 python scripts/mixer_speed.py --mixers gated_deltanet --shapes 4x2048x1024x8 \
  --profile gated_deltanet --hlo $OUT --out $OUT/mixer_t2048_gdn.json 2>&1 \
  | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\." | head -12
timeout 230 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 20
