# Session 40 call 1 (issue 16; carry `.whl .jobs`, ~400 s on an H100/H200): Based's
# Taylor backward, written out vs GPU autodiff, in one process (session 39's queued
# comparison), then a third process of the whole model's one-document rows.
set -x
OUT=${OUT:-/tmp/call1}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
timeout 200 python docs/measurements/session39/compare_taylor_bwd.py 2>&1 \
  | grep -v "^WARNING" | tee $OUT/taylor_bwd.txt
OUT=$OUT BUDGET=360 PARTS=document bash docs/measurements/session34/next_issue16.sh
