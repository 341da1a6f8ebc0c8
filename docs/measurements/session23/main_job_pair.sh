#!/usr/bin/env bash
# one pair: $1 = order ("sg" softmax first, "gs" GDN first), $2 = pair index
cd /work/main
run() {
  rm -rf /tmp/mj/$1_$2
  /usr/bin/time -v python train.py --config=configs/mqar.py --workdir=/tmp/mj/$1_$2 \
    --config.model.mixer=$1 > /tmp/mj/$1_$2.out 2> /tmp/mj/$1_$2.err
  grep -E "Elapsed|System time|Minor" /tmp/mj/$1_$2.err | tr '\n' ' '; echo " <- $1 pair $2"
}
if [ "$1" = sg ]; then run softmax $2; run gated_deltanet $2; else run gated_deltanet $2; run softmax $2; fi
