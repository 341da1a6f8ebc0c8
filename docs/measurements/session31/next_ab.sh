#!/usr/bin/env bash
# Issue 16: where based's and gated_deltanet's shakespeare_char_gpu rate went between
# session 16 (based 0.85x softmax, GDN 1.20x) and session 31's call (0.69x, 0.92x; same
# H200 kind, same script). After that call Based's Taylor gradient went back to autodiff
# of the slices off CPU (the form session 16 measured). train.py's own rate
# (scripts/train_speed.py, 320 steps) in four trees, one process after the other: this
# tree, .ab/s16, .ab/taylor_written (the written-out gradient on the GPU too) and
# .ab/conv_before (next_ab_setup.sh builds them; parts past the budget are skipped).
# Then Performer's rate with the Householder redraw (its rows were cut in session 31;
# against hedgehog's, ~2.7x faster in session 30's lanes).
#   bash docs/measurements/session31/next_ab_setup.sh        # here, before the call
#   run: bash docs/measurements/session31/next_ab.sh   carry: .whl .jobs .ab
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
TEXT=$PWD/.jobs/input.txt
BUDGET=${BUDGET:-580}
source scripts/device_budget.sh
# each tree's train.py imports its own tree's modules (the script's folder comes first)
part 200 python scripts/train_speed.py --text $TEXT --out $OUT/head --rows shake \
  --mixers softmax,based,gated_deltanet --tag _head
part 200 python .ab/s16/scripts/train_speed.py --text $TEXT --out $OUT/s16 --rows shake \
  --mixers softmax,based,gated_deltanet --tag _s16
part 80 python .ab/taylor_written/scripts/train_speed.py --text $TEXT --out $OUT/taylor \
  --rows shake --mixers based --tag _taylor_written
part 80 python .ab/conv_before/scripts/train_speed.py --text $TEXT --out $OUT/conv_before \
  --rows shake --mixers gated_deltanet --tag _conv_before
part 90 python scripts/train_speed.py --text $TEXT --out $OUT/performer --rows shake \
  --mixers performer
echo "all done: $(( $(date +%s) - BUDGET_T0 )) s"
