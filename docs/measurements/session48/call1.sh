#!/usr/bin/env bash
# Session 48, first device call (issue 18): Zoology's own DeltaNet at d128, seeds 0-2, at
# lrs 4.64e-4 and 1e-2 (its two grid neighbours of 2.15e-3, the only lr run so far), six
# processes (nine cut four of session 46's runs); lr 1e-4 follows in call 2.
#   carry: .whl2 .jobs     run from the repository root; results under $OUT
set -u
OUT=${OUT:-/tmp/call1}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$OUT OURS=" " ZOOLOGY=delta_net LRS=4.6415888e-4,1e-2 PARALLEL=6 BUDGET=545 \
  bash docs/measurements/session12/anchor_job.sh
