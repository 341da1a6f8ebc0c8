#!/usr/bin/env bash
# Issue 16, H200 call 4 of session 15 (the budget's last ~200 s): one 8-layer d1024 T2048
# gated_deltanet train.py process (conv_impl xla, the default), 20 steps, with JAX's
# compile log: the init's compile time, the first step, and whether the step is still
# traced twice after kernels.pallas.common imports Pallas' fuser up front.
#   carry: .whl .jobs    results under $OUT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 JAX_LOG_COMPILES=1
timeout 70 python train.py --config=configs/lm_files.py --workdir=/tmp/w \
  --config.data.files=.jobs/input.txt --config.train.steps=20 --config.train.log_every=1 \
  --config.logging.wandb=disabled --config.logging.progress=False \
  --config.train.eval_every=0 --config.train.checkpoint_every=0 \
  --config.model.d_model=1024 --config.model.num_layers=8 --config.model.num_heads=8 \
  --config.model.max_len=2048 --config.data.seq_len=2048 --config.data.sample_by=paragraph \
  --config.train.batch_size=4 --config.model.mixer=gated_deltanet > $OUT/log.txt 2>&1
echo "rc $?"
grep -E "XLA compilation of jit\((init|step)\)|^step (1|2|3|10|20):|^final" $OUT/log.txt | cut -c1-150
