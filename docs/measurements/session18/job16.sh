#!/usr/bin/env bash
# Issue 16, one H200 call (session 18): the compile criterion with repeats and the layer
# scan's compile at 8 and 24 layers, through train.py (scripts/train_speed.py).
# 1. 8-layer d1024 T2048 softmax / gated_deltanet processes, 20 steps each (first_step_s:
#    step 1 with its compile), a pair before and a pair after part 2;
# 2. gated_deltanet with model.scan_layers=True at 8 and at 24 layers (first_step_s; the
#    24-layer row never finished within 45 s in session 16).
# Each part is skipped when the time left would not cover it.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-460}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout $limit "$@"; echo "[rc $? at $(( $(date +%s) - T0 )) s]"
}
pair() {
  part 110 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/compile$1 \
    --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 20 --tag _rep$1
}
pair 1
for L in 8 24; do
  part 120 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/scan$L \
    --rows d1024_T2048 --mixers gated_deltanet --steps 20 --tag _scan$L \
    --extra="--config.model.num_layers=$L --config.model.scan_layers=True"
done
pair 2
echo "all done: $(( $(date +%s) - T0 )) s"
