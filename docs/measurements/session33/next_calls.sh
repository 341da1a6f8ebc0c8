#!/usr/bin/env bash
# Issue 18's GPU calls after session 33, one per argument (each a full call of ~560 s):
#   bash docs/measurements/session33/next_calls.sh hw_zoo      # carry: .whl .jobs
#   bash docs/measurements/session33/next_calls.sh performer   # carry: .whl .jobs
# What session 33 left (three lanes on one H100, 517 + 172 s, checkpoints lost with the
# machine): hedgehog_window_8L's 3 seeds reached step 2,230 (best at 750-1,000, so the
# early stop comes at ~2,500), performer_8L's step 1,370 (still falling; session 12's
# performer runs were best at 1,750-2,000, so ~3,500 steps), and the population of
# hedgehog_distill d256's lrs 2.15e-3 and 1e-2 step 1,800 of 1,955. So hw_zoo runs the
# two short ones as two lanes, performer one lane alone. A lane that does not finish
# resumes from its checkpoint if the same command runs again on the same warm machine.
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
S="configs/compare_shakespeare.py:seeds 60 ${HARD:-560}"
F="--config.overrides.data.files=.jobs/input.txt --yes"
case "${1:-}" in
  hw_zoo)
    M="configs/compare_mqar_zoology.py:paper 60 ${HARD:-560}"
    MF="--config.overrides.train.steps=1955 --yes --config.population_max_members=6"
    ONLY=__hedgehog_distill__d256__lr0.00215443,__hedgehog_distill__d256__lr0.01__
    bash sweeps/h200_sweeps.sh "0 shakespeare_seeds $S --only=hedgehog_window_8L $F" \
      "0 zoology_paper $M --only=$ONLY $MF" ;;
  performer)
    bash sweeps/h200_sweeps.sh "0 shakespeare_seeds $S --only=performer_8L $F" ;;
  *) echo "usage: $0 hw_zoo|performer" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
