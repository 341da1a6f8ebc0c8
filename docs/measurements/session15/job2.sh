#!/usr/bin/env bash
# Issue 16, H200 call 2 of session 15: where an 8-layer d1024 T2048 gated_deltanet
# train.py process spends its time (call 1: not done in 155 s, while softmax's whole
# process took 85 s with a 14 s first step). Each process logs JAX's compile times
# (JAX_LOG_COMPILES) with seconds since the job began, and py-spy dumps its stacks
# (Python and native) every 20 s.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl \
  .whl/py_spy*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH JAX_LOG_COMPILES=1
stamp() { while IFS= read -r line; do echo "$SECONDS $line"; done; }
run() {  # name, limit, extra flags...
  local name=$1 limit=$2; shift 2
  SECONDS=0
  timeout $limit python train.py --config=configs/lm_files.py --workdir=/tmp/w_$name \
    --config.data.files=.jobs/input.txt --config.train.steps=10 --config.train.log_every=1 \
    --config.logging.wandb=disabled --config.logging.progress=False \
    --config.train.eval_every=0 --config.train.checkpoint_every=0 \
    --config.model.d_model=1024 --config.model.num_layers=8 --config.model.num_heads=8 \
    --config.model.max_len=2048 --config.data.seq_len=2048 --config.data.sample_by=paragraph \
    --config.train.batch_size=4 "$@" > >(stamp > $OUT/$name.log) 2>&1 &
  local pid=$!
  ( sleep 15; while kill -0 $pid 2>/dev/null; do
      echo "=== py-spy at $SECONDS s"; py-spy dump --native --pid $pid 2>&1 | head -60
      sleep 20; done ) > $OUT/$name.spy 2>&1 &
  wait $pid; echo "$name rc=$? after $SECONDS s"
}
run gdn8 200 --config.model.mixer=gated_deltanet
run sm8 80 --config.model.mixer=softmax
sleep 2
for f in $OUT/*.log; do echo "== $f"; grep -v -i "warn.*constant\|^$" $f | cut -c1-220 | tail -40; done
