# Session 39 call 1 (issue 16; carry `.whl .jobs`, ~520 s on an H100/H200): Based's
# taylor_qk path (session 38, never run on a GPU) checked against float64 on this GPU's
# real kernels, then session 38's next call (the mixers alone at B4 T8192 with kernel
# lists; the whole model's one-document rows).
set -x
OUT=${OUT:-/tmp/call1}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_pallas_taylor.py \
  2>&1 | tail -15 | tee $OUT/taylor_tests.txt
OUT=$OUT bash docs/measurements/session38/next_call1.sh
