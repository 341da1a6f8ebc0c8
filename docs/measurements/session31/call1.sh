#!/usr/bin/env bash
# Issue 16 on the GPU after session 30's written-out backwards (short conv's XLA form,
# Based's Taylor pairs, lightning's q/k/v split): train.py's own tokens/s, one process
# after the other, nothing else on the device.
# 1. configs/shakespeare_char_gpu.py, 320 steps: softmax, based, gated_deltanet,
#    performer (session 16: based 0.85x softmax, criterion 0.8x; GDN 1.20x, 0.9x);
# 2. 8 layers d1024 T8192 B4, 160 steps: softmax, based (session 14: based 1.13x,
#    criterion 1.0x);
# 3. Performer with this session's Householder redraw of omega against no redraw
#    (performer_redraw_every=0), and linear, deltanet, hedgehog if time is left.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
BUDGET=${BUDGET:-500}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout $limit "$@"; echo "[rc $? at $(( $(date +%s) - T0 )) s]"
}
part 200 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake \
  --rows shake --mixers softmax,based,gated_deltanet,performer
part 60 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake_noredraw \
  --rows shake --mixers performer --tag _noredraw --extra="--config.model.performer_redraw_every=0"
part 150 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t8192 \
  --rows d1024_T8192 --mixers softmax,based --steps 160
part 130 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake2 \
  --rows shake --mixers linear,deltanet,hedgehog
echo "all done: $(( $(date +%s) - T0 )) s"
