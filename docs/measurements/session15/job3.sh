#!/usr/bin/env bash
# Issue 16, H200 call 3 of session 15, after the fused short conv (kernels.pallas.
# short_conv) and the init's threefry GPU kernel (training.model_state):
# 1. the init's bits with the threefry GPU kernel equal those of XLA's form;
# 2. one 8-layer d1024 T2048 gated_deltanet train.py process with JAX's compile log and
#    cache-miss explanations (call 2: jit(init) compiled in 73 s; the step traced twice);
# 3. train.py at d1024 T2048, softmax then gated_deltanet, no compilation cache;
# 4. the mixers alone at B4 T2048 (GDN's kernels listed);
# 5. configs/shakespeare_char_gpu.py rows: softmax, gated_deltanet, based;
# 6. first steps of gated_deltanet with scanned layers at 8 and 24 layers.
# Each part is skipped when the time left would not cover its limit.
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
part 40 python - <<'PY'
import jax, jax.numpy as jnp
from training import builders, model_state, sharding as shd
from models.config import ModelConfig
cfg = ModelConfig(d_model=256, num_layers=2, num_heads=2, mixer="gated_deltanet", vocab_size=256)
make = builders.seeded_model_factory(cfg)
_, _, _, _, logical, shapes = model_state.describe(lambda: make(0))
mesh = shd.make_mesh(1, 1, 1)
init = model_state.seeded_init(make, shd.param_shardings(logical, shapes, mesh), shd.replicated(mesh))
kernel_bits = init(3)[0]
plain = jax.jit(lambda s: model_state.flat_params(__import__("flax").nnx.split(make(s), __import__("flax").nnx.Param, ...)[1]))(jnp.int32(3))
same = all(bool(jnp.array_equal(kernel_bits[k], plain[k])) for k in plain)
print(f"init bits equal with the threefry GPU kernel: {same} ({len(plain)} arrays)")
PY
d1024="--config.model.d_model=1024 --config.model.num_layers=8 --config.model.num_heads=8
  --config.model.max_len=2048 --config.data.seq_len=2048 --config.data.sample_by=paragraph
  --config.train.batch_size=4"
JAX_LOG_COMPILES=1 JAX_EXPLAIN_CACHE_MISSES=1 part 75 python train.py \
  --config=configs/lm_files.py --workdir=/tmp/w_gdn8 --config.data.files=.jobs/input.txt \
  --config.train.steps=10 --config.train.log_every=1 --config.logging.wandb=disabled \
  --config.logging.progress=False --config.train.eval_every=0 \
  --config.train.checkpoint_every=0 $d1024 --config.model.mixer=gated_deltanet \
  > $OUT/gdn8_compile_log.txt 2>&1
grep -E "XLA compilation of jit\((init|step)\)|^step (1|2|10):" $OUT/gdn8_compile_log.txt | cut -c1-160
grep -i -B2 -A12 "cache miss" $OUT/gdn8_compile_log.txt | grep -v -i "warn.*constant" | cut -c1-240 | head -40
part 170 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/t2048 \
  --rows d1024_T2048 --mixers softmax,gated_deltanet --steps 160
part 70 python scripts/mixer_speed.py --mixers softmax,gated_deltanet --shapes 4x2048x1024x8 \
  --profile gated_deltanet --out $OUT/mixers_t2048.json 2>&1 \
  | grep -v -i -E "warning|constant fold|slow_operation|bug|xla_dump|^$|reduce-window|map\." | head -24
part 160 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/shake --rows shake \
  --mixers softmax,gated_deltanet,based --steps 320
for L in 8 24; do
  part 45 python scripts/train_speed.py --text .jobs/input.txt --out $OUT/scan$L \
    --rows d1024_T2048 --mixers gated_deltanet --steps 20 --tag _scan$L \
    --extra "--config.model.num_layers=$L --config.model.scan_layers=True"
done
echo "all done: $(( $(date +%s) - T0 )) s"
