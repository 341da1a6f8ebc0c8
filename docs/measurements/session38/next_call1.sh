# Issue 16, next session's first call (carry `.whl .jobs`, ~480 s on an H100): the
# mixers alone at B4 T8192 (one document a row; gated_deltanet and based listed kernel by
# kernel), then the whole model's document rows (8 layers d1024 B4, T2048 and T8192),
# with session 38's three changes: the short conv's bf16 cotangent store, gated_deltanet's
# gate as its own matmul, Based's in-chunk scores from its 16-dim q, k (taylor_qk).
set -x
OUT=${OUT:-/tmp/next_call1}; mkdir -p "$OUT"
pip install -q --no-deps --target /tmp/site .whl/ml_collections*.whl
PYTHONPATH=/tmp/site:. python scripts/mixer_speed.py --docs 1 \
  --mixers softmax,gated_deltanet,linear,based --shapes 4x8192x1024x8 \
  --profile gated_deltanet,based --out $OUT/mixer.json 2>&1 | grep -v Warning \
  | tail -80 | tee $OUT/mixer_speed.txt
BUDGET=400 PARTS=document OUT=$OUT bash docs/measurements/session34/next_issue16.sh
