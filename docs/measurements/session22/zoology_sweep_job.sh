#!/usr/bin/env bash
# Issue 18: the Zoology paper's MQAR recipe as a population sweep on one H200
# (configs/compare_mqar_zoology.py:paper; each cell = one mixer at one width, its 4 lrs x
# 3 seeds trained as one 12-member population), as session 21's job but with lanes given
# by cells: LANES is a space-separated list of lanes, each a comma-separated list of
# --only patterns (a lane runs its cells one after another, in the config's order).
#   LANES="__gated_deltanet__d128__,__taylor__d128__ __deltanet__d64__" bash ...
# Budget STEPS (default 1,955 = 5 of the paper's 64 epochs) with Zoology's stop at 0.99.
# Sweeps resume: carry runs/h200 back in and finished runs are skipped. EXTRA: more
# sweeps.run flags, e.g. EXTRA=--config.population_max_members=6 for cells whose 12
# members do not fit in a lane's share of the GPU (hedgehog d256 asks ~36 GiB).
#   carry: .whl runs/h200     results: $OUT/sweeps.tgz (no checkpoints)
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
STEPS=${STEPS:-1955}
SOFT=${SOFT:-380}
HARD=${HARD:-520}
FLAGS="--config.overrides.train.steps=$STEPS --yes ${EXTRA:-}"
lanes=()
for only in $LANES; do
  lanes+=("0 zoology_paper configs/compare_mqar_zoology.py:paper $SOFT $HARD --only=$only $FLAGS")
done
bash sweeps/h200_sweeps.sh "${lanes[@]}"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
