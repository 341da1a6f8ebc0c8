#!/usr/bin/env bash
# Session 48, last device call (~320 s of device time left): issue 16's mixer-alone rows
# on an H200 only (each mixer alone, forward + backward, B4 T8192 d1024 8 heads, one
# document a row; three processes as docs/measurements/session45/call1.sh runs them).
# On any other card it stops at once: these rows exist for the H100 (sessions 39, 45).
#   carry: none     run from the repository root; results under $OUT
set -u
OUT=${OUT:-/tmp/call3}; mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
echo "card: $card"
[[ "$card" == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
MIX="--docs 1 --mixers softmax,gated_deltanet,linear,based --shapes 4x8192x1024x8"
for r in 1 2 3; do
  timeout 70 python scripts/mixer_speed.py $MIX --out $OUT/mixer_r$r.json 2>&1 \
    | tee $OUT/mixer_speed_r$r.txt | tail -8
done
