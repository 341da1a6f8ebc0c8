#!/usr/bin/env bash
# Issue 16, H200 call 1 of session 15, at HEAD 5377808 (+ train_speed --extra/--tag):
# 1. the GDN mixer alone at B4 T2048 d1024 with its kernel list, after session 14's
#    unstack (split) fix;
# 2. train.py d1024 T2048 8 layers, softmax then gated_deltanet, no compilation cache:
#    tokens/s side by side and each first step (compilation included);
# 3. first steps of gated_deltanet with scanned layers at 8 and 24 layers (20 steps).
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 60 python scripts/mixer_speed.py --mixers gated_deltanet --shapes 4x2048x1024x8 \
  --profile gated_deltanet --out $OUT/mixer_t2048_gdn.json 2>&1 \
  | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\." | head -16
echo "mixer: $(( $(date +%s) - T0 )) s"
timeout 240 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 160
echo "t2048: $(( $(date +%s) - T0 )) s"
for L in 8 24; do
  timeout 120 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/scan$L \
    --rows d1024_T2048 --mixers gated_deltanet --steps 20 --tag _scan$L \
    --extra "--config.model.num_layers=$L --config.model.scan_layers=True"
  echo "scan$L: $(( $(date +%s) - T0 )) s"
done
