#!/usr/bin/env bash
# Session 47, one device call for two issue-18 jobs side by side on the one GPU (starts
# were scarce this session, so one start carries both): Zoology's own gated delta net at
# lr 1e-2, d128, seeds 0-2, three processes (session 46 cut its seed 1 there), and our
# softmax's NIAH (configs/compare_niah.py:ruler) at lr 3e-4, seeds 3-5.
#   carry: .whl .whl2 .jobs     run from the repository root; results under $OUT
set -u
OUT=${OUT:-/tmp/call_a}; mkdir -p "$OUT/anchor" "$OUT/niah"
mkdir -p runs/whl && cp .whl/ml_collections*.whl runs/whl/
OUT=$OUT/anchor OURS=" " ZOOLOGY=gated_delta_net LRS=1e-2 PARALLEL=3 OURS_MEM=0.4 \
  BUDGET=540 bash docs/measurements/session12/anchor_job.sh > "$OUT/anchor/job.txt" 2>&1 &
# The NIAH lane grows its memory on demand, leaving the rest to Zoology's processes.
XLA_PYTHON_CLIENT_PREALLOCATE=false OUT=$OUT/niah bash sweeps/h200_sweeps.sh \
  "0 niah_s configs/compare_niah.py:ruler 450 560 --only=__softmax__ --config.lrs=(3e-4,) --config.seeds=(3,4,5) --config.overrides.data.files=.jobs/input.txt --yes" \
  > "$OUT/niah/job.txt" 2>&1 &
wait
tail -40 "$OUT/anchor/job.txt"; tail -30 "$OUT/niah/job.txt"
