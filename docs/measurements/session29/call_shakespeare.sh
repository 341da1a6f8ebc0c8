#!/usr/bin/env bash
# Session 29 (issue 18): tiny-Shakespeare with 3 seeds, nanoGPT's recipe
# (configs/compare_shakespeare.py:seeds: each mixer's seeds 0-2 as one population), in
# three lanes on one GPU; a lane runs its mixers in the config's order and starts none
# after its soft deadline. Sweeps resume: carry runs/h200 back in.
#   carry: .whl .jobs     results: $OUT/sweeps.tgz (runs/h200/shakespeare_seeds, logs)
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
SOFT=${SOFT:-330}
HARD=${HARD:-565}
C="configs/compare_shakespeare.py:seeds"
F="--config.overrides.data.files=.jobs/input.txt --yes"
LANES=${LANES:-"softmax_6L,gated_deltanet_8L,lightning_8L hybrid_8L,based_8L,hedgehog_window_8L sliding_window_8L,linear_8L,__deltanet_8L,softmax_8L"}
lanes=()
for only in $LANES; do
  lanes+=("0 shakespeare_seeds $C $SOFT $HARD --only=$only $F")
done
bash sweeps/h200_sweeps.sh "${lanes[@]}"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
