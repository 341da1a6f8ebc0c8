#!/usr/bin/env bash
# Issue 16's speed criteria against softmax at its best, on an H200 (the issue's machine):
# the shake rows and the d1024 rows on one document a row (no segment ids: cuDNN's causal
# kernel), then each mixer alone with gated_deltanet's and based's kernel lists.
#   run: bash docs/measurements/session37/h200_issue16.sh   carry: .whl .jobs  (~480 s on an H100)
set -u
mkdir -p /tmp/hlo
OUT=${OUT:-/tmp/h200_issue16}; mkdir -p "$OUT"
BUDGET=420 OUT=$OUT PARTS="shake document" bash docs/measurements/session34/next_issue16.sh
PYTHONPATH=/tmp/site timeout 200 python scripts/mixer_speed.py --docs 1 \
  --shapes 4x8192x1024x8,4x2048x1024x8,64x256x384x6 \
  --mixers softmax,gated_deltanet,linear,based --profile gated_deltanet,based --hlo /tmp/hlo \
  --out "$OUT/mixer_docs1.json" 2>&1 | grep -v -i warn | tee "$OUT/mixer_docs1.txt"
# the device returns at most 8 files: the six programs go back as one archive
tar -C /tmp/hlo -cf "$OUT/hlo.tar" .
