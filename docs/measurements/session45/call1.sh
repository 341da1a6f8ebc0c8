# Session 45 call 1 (issue 16; carry `.whl .jobs`, ~330 s on an H200): the rows never
# timed on an H200 with the code of now: each mixer alone, forward + backward at B4 T8192
# d1024 8 heads, one document a row (three runs, the first with gated_deltanet's kernel
# list), and the whole model's 8 layers d1024 at T 2,048 on one document a row (softmax,
# gated_deltanet, the 1-in-8 hybrid; scripts/cpu_step_work.py --wall, round-robin).
set -x
OUT=${OUT:-/tmp/call1}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
MIX="--docs 1 --mixers softmax,gated_deltanet,linear,based --shapes 4x8192x1024x8"
timeout 90 python scripts/mixer_speed.py $MIX --profile gated_deltanet \
  --out $OUT/mixer_r1.json 2>&1 | tee $OUT/mixer_speed_r1.txt
for r in 2 3; do
  timeout 60 python scripts/mixer_speed.py $MIX --out $OUT/mixer_r$r.json 2>&1 \
    | tee $OUT/mixer_speed_r$r.txt
done
OUT=$OUT BUDGET=200 PARTS="document_t2048" bash docs/measurements/session34/next_issue16.sh
