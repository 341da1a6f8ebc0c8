#!/usr/bin/env bash
# Issue 19, session 19 call 2: what call 1 left. (a) based's conversion of seed 2 (its
# chain was cut at the call's limit): a new seed-2 teacher and its conversion, through
# convert_job.sh; (b) meanwhile the three mixers from scratch for seed 2 at 200 steps
# (10% of the tokens of call 1's seed-2 teacher, best at step 2,000; session 18's
# from-scratch seed-2 rows ran 125 steps for a teacher best at 1,250).
#   carry: .whl2 .jobs     run from the repository root; results under $OUT
set -u
pip install -q --no-index --no-deps --target /tmp/site_ml .whl2/ml_collections*.whl
export PYTHONPATH=/tmp/site_ml:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
BUDGET=${BUDGET:-420}
for m in based gated_deltanet hedgehog; do
  timeout -s TERM "$BUDGET" python scripts/convert_compare.py --parts=scratch \
    --out=/tmp/scratch200/chain_$m --data=.jobs/input.txt --seeds=2 --mixers=$m \
    --stage1_steps=100 --stage2_steps=100 --results="$OUT/scratch200_$m.json" \
    > "$OUT/scratch200_$m.log" 2>&1 &
done
SEEDS=2 MIXERS=based BUDGET=$BUDGET bash docs/measurements/session13/convert_job.sh
wait
for m in based gated_deltanet hedgehog; do echo "== scratch $m"; grep -v '^\$' "$OUT/scratch200_$m.log" | tail -3 | cut -c1-300; done
