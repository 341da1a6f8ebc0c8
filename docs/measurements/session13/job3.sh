#!/usr/bin/env bash
# Issue 16, H200 call 3: whole models through train.py (scripts/train_speed.py: 8 layers,
# d1024, 8 heads, batch 4, packed paragraphs, bf16, 160 steps, median tokens/s of the
# second half), one process after the other; then the gated_deltanet mixer alone with its
# q, k l2 norm kept out of the short conv's fusion (--barrier_l2) against today's.
#   carry: .whl .jobs (.jobs/input.txt: tiny-Shakespeare)    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t8192 --rows d1024_T8192 \
  --mixers softmax,gated_deltanet,based --steps 160
python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 --rows d1024_T2048 \
  --mixers softmax,gated_deltanet --steps 160
for flag in "" --barrier_l2; do
  python scripts/mixer_speed.py --mixers gated_deltanet $flag 2>&1 | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\."
done
python scripts/train_speed.py --text .jobs/input.txt --out $OUT/hybrid --rows d1024_T8192 \
  --mixers hybrid --steps 160
