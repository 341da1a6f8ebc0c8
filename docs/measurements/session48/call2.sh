#!/usr/bin/env bash
# Session 48, second device call, two jobs side by side on the one GPU (starts are scarce):
# issue 19's LoLCATs stage split (call_lolcats.sh) and issue 18's last Zoology DeltaNet
# lr, 1e-4, seeds 0-2 (three processes; it only has to show where that lr ends).
#   carry: .whl2 .jobs     run from the repository root; results under $OUT
set -u
OUT=${OUT:-/tmp/call2}; mkdir -p "$OUT/anchor" "$OUT/lolcats"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# Zoology's processes take what they need (PYTORCH expandable segments); the conversion
# grows on demand (convert_job.sh turns preallocation off).
OUT=$OUT/anchor OURS=" " ZOOLOGY=delta_net LRS=1e-4 PARALLEL=3 BUDGET=540 \
  bash docs/measurements/session12/anchor_job.sh > "$OUT/anchor/job.txt" 2>&1 &
OUT=$OUT/lolcats BUDGET=550 bash docs/measurements/session48/call_lolcats.sh \
  > "$OUT/lolcats/job.txt" 2>&1 &
wait
tail -40 "$OUT/anchor/job.txt"; tail -40 "$OUT/lolcats/job.txt"
