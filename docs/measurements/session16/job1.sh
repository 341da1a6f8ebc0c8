#!/usr/bin/env bash
# Session 16 call 1 ran this file as docs/measurements/session15/next_job.sh (copied here
# as the record; part 3b failed on "--extra" followed by one flag, fixed since).
# Issue 16, prepared for the next session's first H200 call (not yet run; session 15's
# device time ran out). Each part is skipped when the time left would not cover it.
# 1. one 8-layer d1024 T2048 gated_deltanet train.py process with JAX's compile log:
#    the init's compile (4.8 s in call 3, from 73 s) and whether the step is still traced
#    twice now that kernels.pallas.common imports Pallas' fuser before any trace;
# 2. the GDN mixer alone at B4 T2048 with conv_impl xla and pallas (the fused conv at
#    16 rows x 8 warps, which compiles without spills; 32 x 4 took 7.5 ms);
# 3. train.py d1024 T2048: softmax, gated_deltanet, gated_deltanet with conv_impl=pallas;
# 4. configs/shakespeare_char_gpu.py rows: softmax, gated_deltanet, based;
# 5. first steps with scanned layers at 8 and 24 layers.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-575}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout $limit "$@"; echo "[rc $? at $(( $(date +%s) - T0 )) s]"
}
JAX_LOG_COMPILES=1 part 70 python train.py --config=configs/lm_files.py --workdir=/tmp/w \
  --config.data.files=.jobs/input.txt --config.train.steps=20 --config.train.log_every=1 \
  --config.logging.wandb=disabled --config.logging.progress=False \
  --config.train.eval_every=0 --config.train.checkpoint_every=0 \
  --config.model.d_model=1024 --config.model.num_layers=8 --config.model.num_heads=8 \
  --config.model.max_len=2048 --config.data.seq_len=2048 --config.data.sample_by=paragraph \
  --config.train.batch_size=4 --config.model.mixer=gated_deltanet > $OUT/compile_log.txt 2>&1
grep -E "XLA compilation of jit\((init|step)\)|^step (1|2|3|20):|^final" $OUT/compile_log.txt \
  | cut -c1-150
for impl in xla pallas; do
  part 45 python scripts/mixer_speed.py --mixers gated_deltanet --shapes 4x2048x1024x8 \
    --set conv_impl=$impl --profile gated_deltanet --out $OUT/mixer_conv_$impl.json 2>&1 \
    | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\." \
    | head -12
done
part 150 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 160
part 60 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048_conv \
  --rows d1024_T2048 --mixers gated_deltanet --steps 160 --tag _conv_pallas \
  --extra "--config.model.conv_impl=pallas"
part 150 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake --rows shake \
  --mixers softmax,gated_deltanet,based --steps 320
for L in 8 24; do
  part 45 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/scan$L \
    --rows d1024_T2048 --mixers gated_deltanet --steps 20 --tag _scan$L \
    --extra "--config.model.num_layers=$L --config.model.scan_layers=True"
done
echo "all done: $(( $(date +%s) - T0 )) s"
