#!/usr/bin/env bash
# Issue 18's GPU calls after session 31, one per argument (each a full call of ~560 s):
#   bash docs/measurements/session31/next_calls.sh shakespeare_a   # carry: .whl .jobs
#   bash docs/measurements/session31/next_calls.sh shakespeare_b   # carry: .whl .jobs
# The 3-seed tiny-Shakespeare populations still missing, two lanes a call: lanes on one
# GPU are time-sliced, and with four lanes in session 31 each reached only 1,700-2,600
# steps in 530 s (a run stops 1,500 steps after its best, around step 4,000-5,000), so
# two lanes give each twice the share. A lane that does not finish resumes from its
# checkpoint if the same command runs again on the same warm machine.
# shakespeare_b also runs hedgehog_distill d256's missing lrs (one population of 6).
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
S="configs/compare_shakespeare.py:seeds 60 ${HARD:-560}"
F="--config.overrides.data.files=.jobs/input.txt --yes"
case "${1:-}" in
  shakespeare_a)
    bash sweeps/h200_sweeps.sh "0 shakespeare_seeds $S --only=hedgehog_8L $F" \
      "0 shakespeare_seeds $S --only=taylor_8L $F" ;;
  shakespeare_b)
    M="configs/compare_mqar_zoology.py:paper 60 ${HARD:-560}"
    MF="--config.overrides.train.steps=1955 --yes --config.population_max_members=6"
    ONLY=__hedgehog_distill__d256__lr0.00215443,__hedgehog_distill__d256__lr0.01__
    bash sweeps/h200_sweeps.sh "0 shakespeare_seeds $S --only=hedgehog_window_8L $F" \
      "0 shakespeare_seeds $S --only=performer_8L $F" \
      "0 zoology_paper $M --only=$ONLY $MF" ;;
  *) echo "usage: $0 shakespeare_a|shakespeare_b" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
