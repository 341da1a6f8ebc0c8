#!/usr/bin/env bash
# Issue 16, H200 call 2: where the T = 2,048 gap and the compile time go.
# 1. Mixer alone (fwd+bwd) at B4 T2048 d1024 8 heads, bf16, with its kernels listed.
# 2. First-step compile (scripts/bench_compile.py, one fresh process a row, bf16 as
#    train.py): 8 layers unrolled/scanned for gated_deltanet and softmax, 24 layers
#    scanned, and the 8-layer rows again with XLA's autotuning off (what autotuning costs).
#   carry: .whl    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 170 python scripts/mixer_speed.py --mixers softmax,gated_deltanet --shapes 4x2048x1024x8 \
  --profile softmax,gated_deltanet --out $OUT/mixer_t2048.json 2>&1 \
  | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\."
echo "mixer done: $(( $(date +%s) - T0 )) s"
row() {  # name, XLA flags, --one spec, limit
  XLA_FLAGS="$2" timeout $4 python scripts/bench_compile.py --one=$3 --d_model 1024 \
    --seq_len 2048 --batch 4 --heads 8 2>/tmp/err.txt | tail -1 | sed "s/^{/{\"row\": \"$1\", /" \
    | tee -a $OUT/compile.jsonl
  echo "$1 rc=${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"
  { echo "== $1"; cat /tmp/err.txt; } >> $OUT/stderr.txt; tail -c 400 /tmp/err.txt | grep -v -i warn
}
row gdn8 "" gated_deltanet,8,0 100
row sm8 "" softmax,8,0 100
row gdn8scan "" gated_deltanet,8,1 100
row gdn24scan "" gated_deltanet,24,1 150
row gdn8_noautotune "--xla_gpu_autotune_level=0" gated_deltanet,8,0 100
row sm8_noautotune "--xla_gpu_autotune_level=0" softmax,8,0 100
row sm8scan "" softmax,8,1 100
echo "all done: $(( $(date +%s) - T0 )) s"
