#!/usr/bin/env bash
# Issue 16, H200 call 2: the Based window on cuDNN against the banded form (accuracy and
# fwd+bwd), each mixer alone after the Taylor-slices change (based with either window
# impl), and the gated_deltanet mixer's optimised HLO (to name its largest fusion).
#   run from the repository root; results under $OUT
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python docs/measurements/session10/window_cudnn.py 2>&1 | grep -v -i warning | tail -8
S=${SHAPES:-4x8192x1024x8,64x256x384x6}
python scripts/mixer_speed.py --mixers softmax,gated_deltanet,based --shapes $S \
  --profile gated_deltanet --hlo $OUT --out $OUT/mixers.json 2>&1 | grep -v -i warning
python scripts/mixer_speed.py --mixers softmax,based --shapes $S --set window_impl=cudnn \
  --profile based --out $OUT/based_cudnn.json 2>&1 | grep -v -i warning
