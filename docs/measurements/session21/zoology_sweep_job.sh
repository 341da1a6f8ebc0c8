#!/usr/bin/env bash
# Issue 18: the Zoology paper's MQAR recipe as a population sweep on one H200
# (configs/compare_mqar_zoology.py:paper; each cell = one mixer at one width, its 4 lrs x
# 3 seeds trained as one 12-member population), lanes sharing the GPU, one width each
# (LANES, default "d64 d256"), cells in the config's mixer order (softmax,
# gated_deltanet, deltanet, taylor first). Budget STEPS (default 1,955 = 5 of the paper's
# 64 epochs) with Zoology's early stop at 0.99. GRAD_ACCUM (default 1) splits each
# step's batch (same gradient): session 21's first call ran 2, to fit two populations
# before MQAR's logits were formed only at its queries.
# Sweeps resume: carry runs/h200 back in and finished runs are skipped.
#   carry: .whl runs/h200 (if present)     results: $OUT/sweeps.tgz (no checkpoints)
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
STEPS=${STEPS:-1955}
SOFT=${SOFT:-400}
HARD=${HARD:-570}
FLAGS="--config.overrides.train.steps=$STEPS --config.overrides.train.grad_accum=${GRAD_ACCUM:-1} --yes"
lanes=()
for w in ${LANES:-d64 d256}; do
  lanes+=("0 zoology_paper configs/compare_mqar_zoology.py:paper $SOFT $HARD --only=__${w}__ $FLAGS")
done
bash sweeps/h200_sweeps.sh "${lanes[@]}"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
