#!/usr/bin/env bash
# Session 48, issue 19: how LoLCATs' recipe (configs/convert_lolcats.py) at 57M splits its
# 10% of the teacher's tokens between stage 1 (attention transfer) and stage 2 (LoRA).
# One teacher (seed 0: 57M softmax, 3,000 steps on 105 MB of Python, as sessions 45-46),
# then three conversions of it side by side: --stage1_share 0.25, 0.5 (the default, the
# control on this teacher) and 0.75.
#   carry: .whl2 .jobs     run from the repository root; results under $OUT
set -u
OUT=${OUT:-/tmp/call_lolcats}; mkdir -p "$OUT/s050"
t0=$(date +%s)
SITE=1 MAX_MB=100 STEPS=3000 SEEDS="0" MIXERS="lolcats" PARTS=convert BUDGET=${BUDGET:-560} \
  CHAIN_EXTRA="--stage1_share 0.5" OUT=$OUT/s050 \
  bash docs/measurements/session20/convert50m_job.sh > "$OUT/s050/job.txt" 2>&1 &
JOB=$!
# the teacher is ready once convert_job.sh links it
while [ ! -e /tmp/cmp/teacher_seed0 ] && kill -0 $JOB 2>/dev/null; do sleep 5; done
export PYTHONPATH=/tmp/site_ml:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
left=$(( ${BUDGET:-560} - ($(date +%s) - t0) ))
for share in 0.25 0.75; do
  tag=s${share/./}; mkdir -p "$OUT/$tag"
  timeout -s TERM $left python scripts/convert_compare.py --parts=convert \
    --out=/tmp/cmp/chain_$tag --data=/tmp/corpus/stdlib.txt \
    --teacher_config=configs/lm_files_gpu.py --eval_batches=50 --seeds=0 \
    --mixers=lolcats --teacher_dir="/tmp/cmp/teacher_seed{seed}" \
    --results=$OUT/$tag/results.json --stage1_share $share > "$OUT/$tag/log.txt" 2>&1 &
done
wait
for d in s025 s050 s075; do echo "== $d"; tail -n 12 "$OUT/$d/log.txt" "$OUT/$d/job.txt" 2>/dev/null | cut -c1-300; done
for d in s025 s075; do tail -n 30 /tmp/cmp/chain_$d/log.txt > "$OUT/$d/chain_log.txt" 2>/dev/null; done
# at most 8 files come back: everything as one archive
tar -czf "$OUT/lolcats_share.tgz" -C "$OUT" s025 s050 s075 && rm -rf "$OUT"/s0*
