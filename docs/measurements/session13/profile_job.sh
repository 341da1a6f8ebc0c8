#!/usr/bin/env bash
# Issue 16, H200 call 1: each mixer alone (fwd+bwd, bf16, issue 16's two shapes) with the
# gated_deltanet / based / linear kernels listed, then first-step compile times of the
# d1024 T2048 B4 train step (8 and 24 layers, unrolled and scanned).
#   carry: .whl     run from the repository root; results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python scripts/mixer_speed.py --mixers ${MIXERS:-softmax,gated_deltanet,linear,based} \
  --shapes ${SHAPES:-4x8192x1024x8,64x256x384x6} --profile ${PROFILE:-gated_deltanet,based,linear} \
  --out $OUT/mixer_speed.json ${MIXER_EXTRA:-} 2>&1 | grep -v -i warning
for spec in ${COMPILE:-gated_deltanet,8,0 gated_deltanet,8,1 gated_deltanet,24,1 softmax,8,0 softmax,8,1}; do
  timeout 200 python scripts/bench_compile.py --one=$spec --d_model=1024 --seq_len=2048 \
    --batch=4 --heads=8 2>/dev/null | tail -1 | tee -a $OUT/compile.jsonl
done
