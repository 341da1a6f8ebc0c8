#!/usr/bin/env bash
# Issue 16's whole-model criteria in one job, each row the step train.py runs compiled in
# one process and timed round-robin (scripts/cpu_step_work.py --wall): session 34 showed
# the round-robin form steady to ~1% between processes (shake rows, H100), where train.py
# processes one after another have spread up to 29% (session 33).
#   1. configs/shakespeare_char_gpu.py: softmax, based, gated_deltanet (based >= 0.8x,
#      gated_deltanet >= 0.9x softmax's tokens/s);
#   2. 8 layers d1024 8 heads, B4 T2048 packed byte text (scripts/train_speed.py's
#      d1024 rows, configs/lm_files.py): softmax, gated_deltanet, the 1-in-8 hybrid
#      (gated_deltanet >= 1.0x; hybrid within 5% of gated_deltanet);
#   3. the same at T8192: softmax, gated_deltanet, based, hybrid (gated_deltanet >=
#      1.25x, based >= 1.0x, hybrid within 5%).
# Each variant's "compile" figure is its train step's lower + compile alone (not train.py's
# first step, which also initialises). Ratios with intervals over calls:
# python scripts/speed_ratios.py <files_at> [<earlier files_at> ...] (each txt a round).
#   4. (PARTS=based) where Based's shake step goes: based against its two parts alone
#      (taylor, sliding_window), softmax, and based with the window's banded form
#      (window_impl=blocked) or the Taylor part in the pure-JAX chunk form (impl=chunk).
#   5. (PARTS=compile) the compile criteria's programs, one process: softmax and
#      gated_deltanet at 8 layers (GDN <= 20 s and <= 1.3x softmax), gated_deltanet at 8
#      and 24 layers scanned (24 <= 1.2x 8), d1024 T2048; the figure is the train step's
#      lower + compile (train.py's first step adds init and the first batch).
#   6. (PARTS=packed) and 7. (PARTS=document): below.
#   run: bash docs/measurements/session34/next_issue16.sh   carry: .whl .jobs  (~370 s on an H100)
#        PARTS="based compile" bash docs/measurements/session34/next_issue16.sh   (~400 s)
#   CPU check of the mechanics: SMALL=1 [PARTS=...] bash docs/measurements/session34/next_issue16.sh
set -u
if [ -z "${SMALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
  export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-/tmp/next_issue16}; mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
source scripts/device_budget.sh
TEXT="data.files=$PWD/.jobs/input.txt"
if [ -n "${SMALL:-}" ]; then  # the same commands at a size a 2-core CPU runs in seconds
  SHAKE="$TEXT model.d_model=64 model.num_layers=2 model.num_heads=2 train.batch_size=4"
  big() { echo "$TEXT model.d_model=64 model.num_layers=2 model.num_heads=2 model.max_len=$1 data.seq_len=$1 data.sample_by=paragraph train.batch_size=2"; }
  STEPS="--steps 2 --rounds 2"; STEPS_T8192="--steps 2 --rounds 2"; T2=128; T8=256
else
  SHAKE="$TEXT"
  big() { echo "$TEXT model.d_model=1024 model.num_layers=8 model.num_heads=8 model.max_len=$1 data.seq_len=$1 data.sample_by=paragraph train.batch_size=4"; }
  STEPS="--steps 20 --rounds 8"; STEPS_T8192="--steps 8 --rounds 6"; T2=2048; T8=8192
fi
HYBRID="model.mixer=gated_deltanet model.softmax_every=8"
# default since session 37: softmax at its best (the t2048 / t8192 parts hand it the
# paragraphs as a mask bias, twice its causal kernel's cost at T 8,192)
PARTS=${PARTS:-shake document packed}
has() { [[ " $PARTS " == *" $1 "* ]]; }
# rows NAME LIMIT CONFIG "STEP FLAGS" VARIANT...: one process, its variants compiled and
# timed round-robin (cpu_step_work --wall), printed and kept as $OUT/NAME.txt
rows() {
  local name=$1 limit=$2 config=$3 steps=$4; shift 4
  local variants=(); for v in "$@"; do variants+=(--variant "$v"); done
  part "$limit" python scripts/cpu_step_work.py --wall --config "$config" $steps \
    "${variants[@]}" 2>&1 | grep -v "rounds:" | tee "$OUT/$name.txt"
}
SHAKE_CFG=configs/shakespeare_char_gpu.py; LM=configs/lm_files.py
has shake && rows shake 150 $SHAKE_CFG "$STEPS" "model.mixer=softmax $SHAKE" \
  "model.mixer=based $SHAKE" "model.mixer=gated_deltanet $SHAKE"
has t2048 && rows d1024_T2048 170 $LM "$STEPS" "model.mixer=softmax $(big $T2)" \
  "model.mixer=gated_deltanet $(big $T2)" "$HYBRID $(big $T2)"
has t8192 && rows d1024_T8192 220 $LM "$STEPS_T8192" "model.mixer=softmax $(big $T8)" \
  "model.mixer=gated_deltanet $(big $T8)" "model.mixer=based $(big $T8)" "$HYBRID $(big $T8)"
has based && rows based_parts 200 $SHAKE_CFG "$STEPS" "model.mixer=softmax $SHAKE" \
  "model.mixer=based $SHAKE" "model.mixer=taylor $SHAKE" "model.mixer=sliding_window $SHAKE" \
  "model.mixer=based model.window_impl=blocked $SHAKE" "model.mixer=based model.impl=chunk $SHAKE"
SCAN="model.mixer=gated_deltanet model.scan_layers=True"
has compile && rows compile 200 $LM "--steps 2 --rounds 1" "model.mixer=softmax $(big $T2)" \
  "model.mixer=gated_deltanet $(big $T2)" "$SCAN $(big $T2)" "$SCAN $(big $T2) model.num_layers=24"
# 6. (PARTS=packed, session 36) softmax layers with cuDNN's packed-sequence layout
#    (model.attention_max_segments; tiny-Shakespeare's paragraphs are 14 / 53 documents a
#    row at T 2,048 / 8,192, so the mask path computes 5x / 19x the attention it keeps),
#    beside the mask path, gated_deltanet and the hybrid, one process per length.
PK="model.attention_max_segments"
has packed && rows packed_T2048 170 $LM "$STEPS" "model.mixer=softmax $(big $T2)" \
  "model.mixer=softmax $PK=64 $(big $T2)" "model.mixer=gated_deltanet $(big $T2)" \
  "$HYBRID $PK=64 $(big $T2)"
has packed && rows packed_T8192 220 $LM "$STEPS_T8192" "model.mixer=softmax $(big $T8)" \
  "model.mixer=softmax $PK=128 $(big $T8)" "model.mixer=gated_deltanet $(big $T8)" \
  "$HYBRID $PK=128 $(big $T8)"
# 7. (PARTS=document; document_t2048 for the T 2,048 row alone) the d1024 rows on documents longer than the context
#    (data.sample_by=document, the data's default: tiny-Shakespeare as one document, one
#    run per row), where softmax needs the whole causal T x T: the long-context comparison.
DOC="data.sample_by=document"
{ has document || has document_t2048; } && rows document_T2048 170 $LM "$STEPS" "model.mixer=softmax $(big $T2) $DOC" \
  "model.mixer=gated_deltanet $(big $T2) $DOC" "$HYBRID $(big $T2) $DOC"
has document && rows document_T8192 220 $LM "$STEPS_T8192" "model.mixer=softmax $(big $T8) $DOC" \
  "model.mixer=gated_deltanet $(big $T8) $DOC" "model.mixer=based $(big $T8) $DOC" \
  "$HYBRID $(big $T8) $DOC"
echo "all done: $(( $(date +%s) - BUDGET_T0 )) s"
