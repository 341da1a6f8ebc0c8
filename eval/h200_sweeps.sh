#!/usr/bin/env bash
# The GPU runs behind docs/results.md: comparison sweeps run one after another, each
# with a soft budget (no new run starts after it) and a hard one (killed after it), with
# results snapshotted into $OUT every 15 s, so whatever finished comes back even when
# the command runs out of time.
#
#   bash eval/h200_sweeps.sh "NAME CONFIG SOFT_S HARD_S [eval.compare flags...]" ...
#   bash eval/h200_sweeps.sh "speed configs/compare_speed.py 150 190" \
#       "shakespeare configs/compare_shakespeare.py 250 330 --only=softmax_6L \
#        --config.overrides.data.files=runs/data/input.txt"
#
# Sweeps live in runs/h200/NAME (ignored by git), so a second command on the same warm
# machine skips the runs that already finished (done.json). Wheels for packages the GPU
# image lacks (ml_collections) are read from runs/whl, if present.
set -u
OUT=${OUT:-/tmp/h200_out}
W=${SWEEPS_DIR:-runs/h200}
mkdir -p "$OUT" "$W"

if ls runs/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site runs/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export WANDB_MODE=disabled PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, jax, flax, optax; print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
} >>"$OUT/device.txt" 2>&1

snapshot() {  # everything but checkpoints, atomically replaced
  tar czf "$OUT/sweeps.tgz.tmp" --exclude=checkpoints -C "$W" . 2>/dev/null &&
    mv "$OUT/sweeps.tgz.tmp" "$OUT/sweeps.tgz"
}
(while sleep 15; do snapshot; done) &
SNAP=$!

for stage in "$@"; do
  read -r name config soft hard extra <<<"$stage"
  echo "=== $(date -u +%T) stage $name: $config soft ${soft}s hard ${hard}s $extra" | tee -a "$OUT/log.txt"
  # shellcheck disable=SC2086  # $extra is a list of flags
  timeout -s TERM -k 10 "$hard" python3 -m eval.compare --config="$config" \
    --workdir="$W/$name" --max_wall_s="$soft" --runner=inprocess $extra 2>&1 |
    tr '\r' '\n' | grep -v -E '^\s*$|it/s\]$|s/run' >>"$OUT/log.txt"
  echo "=== $(date -u +%T) stage $name ended (exit ${PIPESTATUS[0]})" | tee -a "$OUT/log.txt"
  snapshot
done
kill "$SNAP" 2>/dev/null
snapshot
tail -n 40 "$OUT/log.txt"
