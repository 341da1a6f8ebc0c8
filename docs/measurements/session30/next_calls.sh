#!/usr/bin/env bash
# The GPU calls session 30 left for issue 18, one per argument (each a full call of
# ~560 s; lanes share one GPU; sweeps resume when runs/h200 is carried back in):
#   bash docs/measurements/session30/next_calls.sh shakespeare   # carry: .whl .jobs
#   bash docs/measurements/session30/next_calls.sh mqar_d256     # carry: .whl
# shakespeare: 3 seeds of the four mixers that still have one (a population each).
# mqar_d256: the two lrs hedgehog d256 and hedgehog_distill d256 did not run in
# session 30 (selected by run name; each lane's 6 runs train as one population).
set -u
mkdir -p runs/whl && cp .whl/*.whl runs/whl/
case "${1:-}" in
  shakespeare)
    S="configs/compare_shakespeare.py:seeds 60 560"
    F="--config.overrides.data.files=.jobs/input.txt --yes"
    bash sweeps/h200_sweeps.sh "0 shakespeare_seeds $S --only=hedgehog_8L $F" \
      "0 shakespeare_seeds $S --only=taylor_8L $F" \
      "0 shakespeare_seeds $S --only=hedgehog_window_8L $F" \
      "0 shakespeare_seeds $S --only=performer_8L $F" ;;
  mqar_d256)
    M="configs/compare_mqar_zoology.py:paper 60 560"
    F="--config.overrides.train.steps=1955 --yes"
    bash sweeps/h200_sweeps.sh \
      "0 zoology_paper $M --only=__hedgehog__d256__lr0.00215443,__hedgehog__d256__lr0.01__ $F" \
      "0 zoology_paper $M --only=__hedgehog_distill__d256__lr0.00215443,__hedgehog_distill__d256__lr0.01__ $F" ;;
  *) echo "usage: $0 shakespeare|mqar_d256" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
