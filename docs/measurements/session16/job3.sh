#!/usr/bin/env bash
# Issue 16, session 16 call 3, with the fused conv on by default (model.conv_impl
# "pallas", 16 rows x 4 warps, jitted once for all layers):
# 1. configs/shakespeare_char_gpu.py: softmax, gated_deltanet, based side by side;
# 2. train.py d1024 T2048: softmax, gated_deltanet, gated_deltanet with conv_impl=xla.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-470}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout $limit "$@"; echo "[rc $? at $(( $(date +%s) - T0 )) s]"
}
part 250 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake --rows shake \
  --mixers softmax,gated_deltanet,based --steps 320
part 200 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 160
part 70 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048_xla \
  --rows d1024_T2048 --mixers gated_deltanet --steps 160 --tag _conv_xla \
  --extra="--config.model.conv_impl=xla"
echo "all done: $(( $(date +%s) - T0 )) s"
