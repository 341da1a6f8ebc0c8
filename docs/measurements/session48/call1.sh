#!/usr/bin/env bash
# Session 48, first device call: what it runs depends on the card that came, since issue
# 16's rows must be timed on an H200 and issue 18's anchor runs on either card.
#   H200: issue 16's rows never timed on one (docs/measurements/session45/call1.sh, ~330 s).
#   H100: Zoology's own DeltaNet at d128, lrs 1e-4 and 4.64e-4, seeds 0-2, six processes
#         (anchor_job.sh; the lr 1e-2 runs follow in the next call).
#   carry: .whl .whl2 .jobs     run from the repository root; results under $OUT
set -u
OUT=${OUT:-/tmp/call1}; mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
if [[ "$card" == *H200* ]]; then
  OUT=$OUT bash docs/measurements/session45/call1.sh
else
  OUT=$OUT OURS=" " ZOOLOGY=delta_net LRS=1e-4,4.6415888e-4 PARALLEL=6 BUDGET=540 \
    bash docs/measurements/session12/anchor_job.sh
fi
