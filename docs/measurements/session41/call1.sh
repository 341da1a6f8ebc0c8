# Session 41 call 1 (issue 16; carry `.whl .jobs`, ~540 s on an H100 or H200): Based's
# Taylor features as two tiles (128 + 32) against one of 256, the op and the mixer alone
# (compare_feature_tiles.py), then session 40's call 3 with the new default: the whole
# model's T 8,192 one-document rows (softmax, gated_deltanet, based) and the
# tiny-Shakespeare rows.
set -x
OUT=${OUT:-/tmp/call1}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
timeout 190 python docs/measurements/session41/compare_feature_tiles.py \
  --out "$OUT/feature_tiles.json" 2>&1 | grep -v "^WARNING" | tee "$OUT/feature_tiles.txt"
OUT=$OUT bash docs/measurements/session40/call3.sh
