#!/usr/bin/env bash
# Issue 16, prepared for the next session's first H200 call (not yet run). Each part is
# skipped when the time left would not cover it.
# 1. compile criterion with repeats: 8-layer d1024 T2048 softmax / gated_deltanet
#    processes alternating, 20 steps each, three pairs (first_step_s of each; the
#    session 16 figures moved 11-18 s for softmax and 14-27 s for GDN between calls);
# 2. scanned GDN at 8 and 24 layers (first step; the 24-layer row never finished within
#    a 45 s part limit, so 120 s here);
# 3. the gated delta rule's kernels at the launch settings that compile without spills
#    for sm_90 (scripts/triton_spills.py --kernel gdn: prep_bwd_warps=8, seq_warps=8,
#    kkt_solve_warps=2) beside the defaults, at B4 T2048 H8 D128 and B64 T256 H6 D64
#    (issue 16 item 4's short sequences), fwd+bwd against cuDNN;
# 4. if time is left, the T2048 throughput pair again (160 steps), a second sample.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-570}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout $limit "$@"; echo "[rc $? at $(( $(date +%s) - T0 )) s]"
}
for rep in 1 2 3; do
  part 110 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/compile$rep \
    --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 20 --tag _rep$rep
done
for L in 8 24; do
  part 120 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/scan$L \
    --rows d1024_T2048 --mixers gated_deltanet --steps 20 --tag _scan$L \
    --extra="--config.model.num_layers=$L --config.model.scan_layers=True"
done
for shape in "4x2048 8 128" "64x256 6 64"; do
  set -- $shape
  part 100 python scripts/bench_kernels.py --out $OUT/k_$1 --shapes $1 --heads $2 --dim $3 \
    --packed '' --chunk-shapes '' --skip chunk,fla,flagraph,bv64 --budget-s 80 \
    --variant nospill:prep_bwd_warps=8,seq_warps=8,kkt_solve_warps=2 2>&1 | tail -20
done
part 150 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 160
echo "all done: $(( $(date +%s) - T0 )) s"
