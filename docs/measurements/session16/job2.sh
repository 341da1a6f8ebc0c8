#!/usr/bin/env bash
# Issue 16, session 16 call 2 (call 1 was session15/next_job.sh). Each part is skipped
# when the time left would not cover it.
# 1. the conv path alone (scripts/bench_short_conv.py): XLA's form against the rewritten
#    Pallas kernel (shifted reads, two-program backward) at three tunings;
# 2. the GDN mixer alone at B4 T2048 with conv_impl xla and pallas (32 rows x 4 warps);
# 3. train.py d1024 T2048: softmax, gated_deltanet, gated_deltanet with conv_impl=pallas;
# 4. configs/shakespeare_char_gpu.py: softmax, based (call 1 had softmax and GDN; based
#    was cut);
# 5. the 8-layer GDN step's compile with XLA's GPU compiler timers.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout $limit "$@"; echo "[rc $? at $(( $(date +%s) - T0 )) s]"
}
quiet() { grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\."; }
part 60 python scripts/bench_short_conv.py --shape 4x2048x1024x8 --settings 16x4,32x4,64x8 \
  --out $OUT/conv_alone.json 2>&1 | quiet
for impl in xla pallas; do
  part 45 python scripts/mixer_speed.py --mixers gated_deltanet --shapes 4x2048x1024x8 \
    --set conv_impl=$impl --profile gated_deltanet --out $OUT/mixer_conv_$impl.json 2>&1 \
    | quiet | head -14
done
part 160 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 160
part 70 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048_conv \
  --rows d1024_T2048 --mixers gated_deltanet --steps 160 --tag _conv_pallas \
  --extra="--config.model.conv_impl=pallas"
part 150 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake --rows shake \
  --mixers based,softmax --steps 320
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1 JAX_LOG_COMPILES=1 \
  part 60 python train.py --config=configs/lm_files.py --workdir=/tmp/w \
  --config.data.files=.jobs/input.txt --config.train.steps=3 --config.train.log_every=1 \
  --config.logging.wandb=disabled --config.logging.progress=False \
  --config.train.eval_every=0 --config.train.checkpoint_every=0 \
  --config.model.d_model=1024 --config.model.num_layers=8 --config.model.num_heads=8 \
  --config.model.max_len=2048 --config.data.seq_len=2048 --config.data.sample_by=paragraph \
  --config.train.batch_size=4 --config.model.mixer=gated_deltanet > $OUT/compile_timers.txt 2>&1
grep -E "XLA compilation of jit\((init|step)\)|^step (1|2|3):" $OUT/compile_timers.txt | cut -c1-150
grep -E "took|Timer" $OUT/compile_timers.txt | sort -t' ' -k1,1 | tail -25 | cut -c1-200
echo "all done: $(( $(date +%s) - T0 )) s"
