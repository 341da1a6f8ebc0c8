#!/usr/bin/env bash
# Issue 19: LoLCATs' recipe (configs/convert_lolcats.py) at 57M, one teacher converted
# several ways side by side. One teacher (seed 0: 57M softmax, 3,000 steps on 105 MB of
# Python, as sessions 45-46), converted by convert_job.sh with CONTROL (convert_compare
# options; default the recipe as it is, --stage1_share 0.5), and beside it one more
# conversion of the same teacher per VARIANTS entry "tag:option[|option...]" (options of
# scripts/convert_compare.py, e.g. --convert_extra=--config.model.window=128).
# Session 48 ran the defaults: the stage split, --stage1_share 0.25, 0.5 and 0.75.
#   carry: .whl2 .jobs     run from the repository root; results under $OUT
set -u -f  # -f: a layer pattern's "*" is no glob
OUT=${OUT:-/tmp/call_lolcats}; mkdir -p "$OUT/control"
VARIANTS=${VARIANTS:-"s025:--stage1_share=0.25 s075:--stage1_share=0.75"}
t0=$(date +%s)
SITE=1 MAX_MB=100 STEPS=3000 SEEDS="0" MIXERS="lolcats" PARTS=convert BUDGET=${BUDGET:-560} \
  CHAIN_EXTRA="${CONTROL:---stage1_share 0.5}" OUT=$OUT/control \
  bash docs/measurements/session20/convert50m_job.sh > "$OUT/control/job.txt" 2>&1 &
JOB=$!
# the teacher is ready once convert_job.sh links it
while [ ! -e /tmp/cmp/teacher_seed0 ] && kill -0 $JOB 2>/dev/null; do sleep 5; done
export PYTHONPATH=/tmp/site_ml:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
left=$(( ${BUDGET:-560} - ($(date +%s) - t0) ))
tags=(control)
for variant in $VARIANTS; do
  tag=${variant%%:*}; IFS='|' read -r -a options <<< "${variant#*:}"
  tags+=("$tag"); mkdir -p "$OUT/$tag"
  timeout -s TERM $left python scripts/convert_compare.py --parts=convert \
    --out=/tmp/cmp/chain_$tag --data=/tmp/corpus/stdlib.txt \
    --teacher_config=configs/lm_files_gpu.py --eval_batches=50 --seeds=0 \
    --mixers=lolcats --teacher_dir="/tmp/cmp/teacher_seed{seed}" \
    --results=$OUT/$tag/results.json "${options[@]}" > "$OUT/$tag/log.txt" 2>&1 &
done
wait
for d in "${tags[@]}"; do
  echo "== $d"; tail -n 12 "$OUT/$d/log.txt" "$OUT/$d/job.txt" 2>/dev/null | cut -c1-300
  [ "$d" = control ] || tail -n 30 /tmp/cmp/chain_$d/log.txt > "$OUT/$d/chain_log.txt" 2>/dev/null
done
# at most 8 files come back: everything as one archive
tar -czf "$OUT/lolcats.tgz" -C "$OUT" "${tags[@]}" && (cd "$OUT" && rm -rf "${tags[@]}")
