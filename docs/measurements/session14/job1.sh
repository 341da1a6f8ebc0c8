#!/usr/bin/env bash
# Issue 16, H200 call 1: whole models through train.py (scripts/train_speed.py: 8 layers,
# d1024, 8 heads, batch 4, packed paragraphs, bf16, 160 steps, median tokens/s of the
# second half), one process after the other, at T = 8,192 (softmax, gated_deltanet, based,
# hybrid) and T = 2,048 (softmax, gated_deltanet).
# Compiling each row takes 1.5-3 minutes, which would not fit one call. So the rows first
# run all at once (no preallocation) with JAX's persistent compilation cache on, which
# only fills the cache; then the timed rows run one after the other and load their
# compiled programs (same HLO, same executable) from it. The warm runs' figures are
# discarded. Then the gated_deltanet mixer alone with and without --barrier_l2.
#   carry: .whl .jobs (.jobs/input.txt: tiny-Shakespeare)    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
T0=$(date +%s)
for row in d1024_T8192:softmax d1024_T8192:gated_deltanet d1024_T8192:based \
           d1024_T8192:hybrid d1024_T2048:softmax d1024_T2048:gated_deltanet; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 330 python scripts/train_speed.py \
    --text .jobs/input.txt --out /tmp/warm/${row/:/_} --workroot /tmp/warm_${row/:/_} \
    --rows ${row%:*} --mixers ${row#*:} --steps 160 > /tmp/warm_${row/:/_}.log 2>&1 &
done
wait
echo "warm phase: $(( $(date +%s) - T0 )) s"; grep -h "tokens_per_s\|failed" /tmp/warm_*.log | cut -c1-300
du -sh /tmp/jax_cache
python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t8192 --rows d1024_T8192 \
  --mixers softmax,gated_deltanet,based,hybrid --steps 160
echo "t8192 done: $(( $(date +%s) - T0 )) s"
python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 --rows d1024_T2048 \
  --mixers softmax,gated_deltanet --steps 160
echo "t2048 done: $(( $(date +%s) - T0 )) s"
unset JAX_COMPILATION_CACHE_DIR
for flag in "" --barrier_l2; do
  timeout 100 python scripts/mixer_speed.py --mixers softmax,gated_deltanet --shapes 4x8192x1024x8 $flag 2>&1 \
    | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\."
done
echo "all done: $(( $(date +%s) - T0 )) s"
