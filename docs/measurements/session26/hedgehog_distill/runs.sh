#!/usr/bin/env bash
# Issue 18, Hedgehog on a reduced form of the Zoology paper recipe on the 2-core CPU
# (session 25's runs.sh, session 26's copy beside its patched_train.py) (d64, one head, batch 64 instead of 256, lr 1e-2 or 2.15e-3 on a 1,200-step
# cosine, seed 0), each run stopped after its step-400 evaluation (eval every 200 steps).
#   bash docs/measurements/session25/hedgehog_cpu/runs.sh NAME [train.py flags...]
#   PY="python docs/measurements/session26/hedgehog_distill/patched_train.py" LAMBDA=1 \
#       bash docs/measurements/session26/hedgehog_distill/runs.sh hh_distill --config.model.mixer=hedgehog
set -u
name=$1; shift
w=${WORK:-/tmp/zp}/$name
rm -rf "$w"; mkdir -p "$(dirname "$w")"
${PY:-python train.py} --config=configs/mqar_zoology_paper.py --workdir="$w" \
  --config.model.d_model=64 --config.model.num_heads=1 --config.train.lr=0.01 \
  --config.train.batch_size=64 --config.train.steps=1200 --config.train.eval_every=200 \
  --config.train.checkpoint_every=0 --config.logging.wandb=disabled "$@" > "$w.log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do
  if [ "$(grep -c 'eval_accuracy' "$w.log")" -ge 2 ]; then
    kill -INT $pid; sleep 2; kill -9 $pid 2>/dev/null
  fi
  sleep 3
done
echo "$name: $(grep -o 'eval_accuracy [0-9.]*' "$w.log" | tr '\n' ' ')"
