#!/usr/bin/env bash
# Issue 18, two warm calls of the same command (the second resumes the first's sweeps
# in runs/h200): tiny-Shakespeare 3 seeds for hedgehog, taylor and hedgehog_window (one
# population each), and the MQAR paper-recipe d256 lrs that session 30 did not reach
# (hedgehog and hedgehog_distill at 2.15e-3 and 1e-2, one population of 6 each).
# performer_8L is left out: it reached step ~1,000 in 525 s with four lanes.
#   carry: .whl .jobs
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
S="configs/compare_shakespeare.py:seeds 420 ${HARD:-560}"
F="--config.overrides.data.files=.jobs/input.txt --yes"
M="configs/compare_mqar_zoology.py:paper 420 ${HARD:-560}"
MF="--config.overrides.train.steps=1955 --yes --config.population_max_members=6"
ONLY=__hedgehog__d256__lr0.00215443,__hedgehog__d256__lr0.01__,__hedgehog_distill__d256__lr0.00215443,__hedgehog_distill__d256__lr0.01__
bash sweeps/h200_sweeps.sh "0 shakespeare_seeds $S --only=hedgehog_8L $F" \
  "0 shakespeare_seeds $S --only=taylor_8L $F" \
  "0 shakespeare_seeds $S --only=hedgehog_window_8L $F" \
  "0 zoology_paper $M --only=$ONLY $MF"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
