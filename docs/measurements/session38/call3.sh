# Session 38, call 3: (issue 16) the mixers alone with this session's two changes (the
# short conv's bf16 stored cotangent, gated_deltanet's gate as its own matmul), one
# document a row, gated_deltanet listed kernel by kernel; then (issue 18) NIAH with
# RULER's needles for based, 3 seeds (session 35's protocol), alone on the GPU after it.
set -x
pip install -q --no-deps --target /tmp/site .whl/ml_collections*.whl
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:. python scripts/mixer_speed.py --docs 1 --mixers softmax,gated_deltanet \
  --shapes 4x8192x1024x8,4x2048x1024x8 --profile gated_deltanet --out $OUT/mixer.json 2>&1 \
  | grep -v Warning | tail -70 | tee $OUT/mixer_speed.txt
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
bash sweeps/h200_sweeps.sh "0 niah_ruler configs/compare_niah.py:ruler 230 400 --only=__based__ --config.overrides.data.files=.jobs/input.txt --yes"
