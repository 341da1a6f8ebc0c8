#!/usr/bin/env bash
# Issue 16, prepared for the next session's first H200 call (not yet run):
# 1. gated_deltanet's first step alone at d1024 T2048 (train.py, no cache; its row was cut
#    in call 3) and its tokens/s after the split fix (unstack) and the jitted Pallas entry;
# 2. bench_compile's 8-layer unrolled row that printed nothing in call 2, with its phases
#    on stderr (describe / init / lower / compile);
# 3. configs/shakespeare_char_gpu.py rows (softmax, gated_deltanet, based), warmed at once
#    through the compilation cache and then timed one after the other, as job1.sh does.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 200 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers gated_deltanet --steps 160
echo "t2048 gdn: $(( $(date +%s) - T0 )) s"
timeout 120 python scripts/bench_compile.py --one=gated_deltanet,8,0 --d_model 1024 \
  --seq_len 2048 --batch 4 --heads 8 2>&1 | grep -v -i warn | tail -8
echo "bench_compile: $(( $(date +%s) - T0 )) s"
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
for m in softmax gated_deltanet based; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python scripts/train_speed.py \
    --text .jobs/input.txt --out /tmp/warm/$m --workroot /tmp/warm_$m --rows shake \
    --mixers $m --steps 320 > /tmp/warm_$m.log 2>&1 &
done
wait
python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake --rows shake \
  --mixers softmax,gated_deltanet,based --steps 320
echo "all done: $(( $(date +%s) - T0 )) s"
