# Session 40 call 3 (issue 16; carry `.whl .jobs`, ~300 s on an H100): Based with the
# written-out Taylor backward on every backend (call 1: 5% faster mixer at T 8,192), the
# whole model's rows it enters, each beside softmax and gated_deltanet in one process
# (scripts/cpu_step_work.py --wall, round-robin): 8 layers d1024 at T 8,192 on one
# document a row, then tiny-Shakespeare (configs/shakespeare_char_gpu.py).
set -x
OUT=${OUT:-/tmp/call3}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
BIG="data.files=$PWD/.jobs/input.txt model.d_model=1024 model.num_layers=8 model.num_heads=8 model.max_len=8192 data.seq_len=8192 data.sample_by=document train.batch_size=4"
timeout 170 python scripts/cpu_step_work.py --wall --config configs/lm_files.py --steps 8 \
  --rounds 6 --variant "model.mixer=softmax $BIG" --variant "model.mixer=gated_deltanet $BIG" \
  --variant "model.mixer=based $BIG" 2>&1 | grep -v "rounds:" | tee $OUT/document_T8192.txt
OUT=$OUT BUDGET=150 PARTS="shake" bash docs/measurements/session34/next_issue16.sh
