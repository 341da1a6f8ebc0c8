#!/usr/bin/env bash
# The GPU runs behind docs/results.md: comparison sweeps in parallel lanes. A lane is one
# GPU and a list of stages run one after another. Give each GPU one lane: lanes sharing a
# GPU are time-sliced by the driver: on an H200 the nanoGPT-recipe run trained at 195k
# tokens/s sharing its GPU with an MQAR sweep and at 500-570k alone (docs/results.md). Each stage has a soft deadline (no new run
# starts after it) and a hard one (killed then), both in seconds since this script started. Results
# are snapshotted into $OUT every 15 s, so whatever finished comes back even when the
# command runs out of time.
#
#   bash sweeps/h200_sweeps.sh "GPU NAME CONFIG SOFT HARD [sweeps.run flags...] ; NAME ..." ...
# A stage "wait FILE SOFT HARD" holds its lane until FILE exists (e.g. a benchmark that
# needs the GPU alone has finished) or SOFT seconds have passed.
#   bash sweeps/h200_sweeps.sh \
#     "0 shakespeare configs/compare_shakespeare.py 480 540 --shard=0/2 --config.overrides.data.files=runs/data/input.txt" \
#     "1 shakespeare configs/compare_shakespeare.py 480 540 --shard=1/2 --config.overrides.data.files=runs/data/input.txt"
#
# Sweeps live in runs/h200/NAME (ignored by git), so a later command on a machine that
# has them (carried back in) skips the runs that already finished (done.json). Wheels for
# packages the GPU image lacks (ml_collections) are read from runs/whl, if present.
set -u
OUT=${OUT:-/tmp/h200_out}
W=${SWEEPS_DIR:-runs/h200}
mkdir -p "$OUT" "$W/logs"
T0=$(date +%s)

if ls runs/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site runs/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export WANDB_MODE=disabled PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, jax, flax, optax; print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
} >>"$OUT/device.txt" 2>&1

# GPU memory per process: lanes that share a GPU split it.
declare -A PER_GPU=()
for lane in "$@"; do
  g=${lane%% *}
  PER_GPU[$g]=$(( ${PER_GPU[$g]:-0} + 1 ))
done

snapshot() {  # everything but checkpoints, atomically replaced
  tar czf "$OUT/sweeps.tgz.tmp" --exclude=checkpoints -C "$W" . 2>/dev/null &&
    mv "$OUT/sweeps.tgz.tmp" "$OUT/sweeps.tgz"
}

run_lane() {  # $1 = lane number, $2 = "GPU stage ; stage ; ..."
  local n=$1 gpu=${2%% *} stages=${2#* } log="$W/logs/lane$1.txt"
  mkdir -p "$W/logs"
  export CUDA_VISIBLE_DEVICES=$gpu
  XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / ${PER_GPU[$gpu]}, 2))")
  export XLA_PYTHON_CLIENT_MEM_FRACTION
  IFS=';' read -ra list <<<"$stages"
  for stage in "${list[@]}"; do
    read -r name config soft hard extra <<<"$stage"
    local now=$(( $(date +%s) - T0 ))
    if [[ $name == wait ]]; then  # "wait FILE SOFT HARD": until FILE exists (another job
      # on this GPU is done) or SOFT seconds have passed
      while [[ ! -e $config ]] && (( $(date +%s) - T0 < soft )); do sleep 2; done
      echo "=== $(date -u +%T) lane $n: waited for $config" | tee -a "$log"
      continue
    fi
    if (( hard - now < 45 )); then
      echo "=== lane $n: skip $name (hard deadline ${hard}s, now ${now}s)" | tee -a "$log"
      continue
    fi
    local s=$(( soft > now ? soft - now : 1 ))
    echo "=== $(date -u +%T) lane $n gpu $gpu stage $name: $config soft ${s}s hard $((hard - now))s $extra" | tee -a "$log"
    # the flags split as a shell would, quotes kept together: --config.seeds="(3, 4, 5)"
    # is one flag (xargs parses quotes and runs nothing but printf)
    local flags=()
    [[ -n $extra ]] && mapfile -d '' flags < <(printf '%s' "$extra" | xargs printf '%s\0')
    timeout -s TERM -k 10 $(( hard - now )) python3 -m sweeps.run --config="$config" \
      --workdir="$W/$name" --max_wall_s="$s" --runner=inprocess "${flags[@]}" 2>&1 |
      tr '\r' '\n' | grep -v -E '^\s*$|it/s\]$|s/run' >>"$log"
    echo "=== $(date -u +%T) lane $n stage $name ended (exit ${PIPESTATUS[0]})" | tee -a "$log"
  done
}

(while sleep 15; do snapshot; done) &
SNAP=$!
pids=()
i=0
for lane in "$@"; do
  run_lane "$i" "$lane" &
  pids+=($!)
  i=$((i + 1))
done
wait "${pids[@]}"
kill "$SNAP" 2>/dev/null
snapshot
for f in "$W"/logs/lane*.txt; do echo "--- $f"; grep -E "^===|done in|FAILED|stopping early|Error" "$f" | tail -n 25; done
