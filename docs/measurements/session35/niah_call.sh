#!/usr/bin/env bash
# Issue 18's NIAH RULER lanes (softmax and the hybrid; 3 seeds as one population each),
# after a GPU check that cuDNN attention under vmap + grad now runs (the first try this
# session stopped in both lanes at the population's backward; see cudnn_vmap_check.py).
#   run: bash docs/measurements/session35/niah_call.sh    carry: .whl .jobs
set -u
export PYTHONPATH=$PWD
python docs/measurements/session35/cudnn_vmap_check.py 2>&1 | tail -4 | tee $OUT/cudnn_vmap_check.txt
rm -rf runs/h200/niah_ruler  # a warm machine keeps the failed first try
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
bash sweeps/h200_sweeps.sh \
  "0 niah_ruler configs/compare_niah.py:ruler 280 ${HARD:-520} --only=__softmax__ --config.overrides.data.files=.jobs/input.txt --yes" \
  "0 niah_ruler configs/compare_niah.py:ruler 280 ${HARD:-520} --only=__hybrid__ --config.overrides.data.files=.jobs/input.txt --yes"
