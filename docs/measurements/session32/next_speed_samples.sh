#!/usr/bin/env bash
# Issue 16, shakespeare_char_gpu criteria (based >= 0.8x softmax, gated_deltanet >= 0.9x):
# three samples of the three rows in one job on an H200, the rows' order rotated each
# round, so that a ratio has an interval (session 31's H200 gave based 0.69x, session
# 32's H100 0.83x, one sample each). ~145 s a round.
#   run: bash docs/measurements/session32/next_speed_samples.sh   carry: .whl .jobs
#   then here: python scripts/speed_ratios.py <the call's files_at>  (ratios, interval)
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
BUDGET=${BUDGET:-570}
source scripts/device_budget.sh
orders=(softmax,based,gated_deltanet gated_deltanet,softmax,based based,gated_deltanet,softmax)
for r in 0 1 2; do
  part 175 python scripts/train_speed.py --text "$PWD/.jobs/input.txt" --out "$OUT/round$r" \
    --rows shake --mixers "${orders[$r]}" --tag "_r$r"
done
echo "all done: $(( $(date +%s) - BUDGET_T0 )) s"
