# Session 38, call 1 (issue 16): the short conv's backward, session 36's programs against
# session 37's (float32 / bf16 stored cotangent), then the mixers alone at B4 T8192 with
# one document a row, gated_deltanet listed kernel by kernel.
set -x
pip install -q --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name --format=csv,noheader
python docs/measurements/session37/compare_short_conv.py 2>&1 | grep -v Warning | tee $OUT/compare_short_conv.txt
python scripts/mixer_speed.py --docs 1 --mixers softmax,gated_deltanet,linear,based \
  --shapes 4x8192x1024x8 --profile gated_deltanet --out $OUT/mixer.json 2>&1 | tail -60 | tee $OUT/mixer_speed.txt
