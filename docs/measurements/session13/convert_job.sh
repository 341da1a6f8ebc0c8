#!/usr/bin/env bash
# Issue 19, one H200 call: 3 softmax teachers (configs/shakespeare_char_gpu.py, nanoGPT's
# shakespeare_char recipe, seeds 0-2) as one training.population program, evaluated and
# checkpointed every 250 steps and stopped 3 evaluations after their best; each teacher is
# its best checkpoint (as nanoGPT keeps it). Then, all at once, every (seed, mixer)
# conversion of scripts/convert_compare.py with 10% of the tokens the teacher had seen at
# that checkpoint, and (PARTS="convert scratch") the same mixer trained from scratch for the
# same steps. One process per (part, mixer) runs the seeds one after another, so its
# second and third seed take their programs from JAX's persistent compilation cache (nine
# processes compiling at once did not finish in 370 s in session 18).
# Every process runs without preallocation so they share the GPU. Results:
# $OUT/convert_results.json (merged every 20 s, so a call cut at its limit still returns
# what finished), $OUT/convert_log.txt. Env: SEEDS, MIXERS, PARTS, BUDGET, TEACHER_EXTRA
# (population overrides of the teachers), CHAIN_EXTRA (convert_compare options),
# TEACHER_CONFIG (default configs/shakespeare_char_gpu.py), DATA (default .jobs/input.txt),
# EVAL_BATCHES (default 200), MAX_CHAINS (default 4).
#   carry: .whl2 .jobs     run from the repository root
set -u
pip install -q --no-index --no-deps --target /tmp/site_ml .whl2/ml_collections*.whl
export PYTHONPATH=/tmp/site_ml:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
W=/tmp/cmp; rm -rf "$W"; mkdir -p "$W"
SEEDS=${SEEDS:-0 1 2}; MIXERS=${MIXERS:-hedgehog based gated_deltanet}
TEACHER_CONFIG=${TEACHER_CONFIG:-configs/shakespeare_char_gpu.py}
DATA=${DATA:-.jobs/input.txt}; EVAL_BATCHES=${EVAL_BATCHES:-200}
common="--config.data.files=$DATA --config.train.eval_batches=$EVAL_BATCHES
  --config.logging.progress=False --config.logging.wandb=disabled"
merge() {
  python - "$W" "$OUT" <<'PY'
import json, pathlib, sys
w, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = []
for f in sorted(w.glob("res_*.json")):
    try:
        rows += json.loads(f.read_text())
    except ValueError:
        pass
teach = {}
for d in sorted(w.glob("teacher_seed*")):
    m = d / "metrics.jsonl"
    if m.exists():
        es = [json.loads(l) for l in m.read_text().splitlines() if l.strip()]
        teach[d.name] = [{k: e[k] for k in ("step", "eval_loss", "tokens_per_s", "loss")
                          if k in e} for e in es if "eval_loss" in e or e.get("step", 0) % 500 == 0]
(out / "convert_results.json").write_text(json.dumps({"rows": rows, "teachers": teach}, indent=1))
PY
}
( while sleep 20; do merge; done ) & MERGER=$!
t0=$(date +%s)
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - t0) )); }
lr=$(python -c "import runpy; print(runpy.run_path('$TEACHER_CONFIG')['get_config']().train.lr)")
timeout -s TERM $(left) python -m training.population \
  --config=$TEACHER_CONFIG --workdir=$W/teachers --lrs=$lr \
  --seeds=$(echo $SEEDS | tr ' ' ,) $common --config.train.eval_every=250 \
  --config.train.checkpoint_every=250 --config.train.early_stop_patience=3 \
  ${TEACHER_EXTRA:-} > $W/teachers.log 2>&1
for s in $SEEDS; do ln -s "$(ls -d $W/teachers/lr*_seed$s)" $W/teacher_seed$s; done
echo "teachers done at $(( $(date +%s) - t0 )) s"; tail -n 5 $W/teachers.log
# At most MAX_CHAINS chains at once (default 4), conversions before scratch runs: eight
# processes without preallocation ran a 57M conversion out of GPU memory (session 36).
MAX_CHAINS=${MAX_CHAINS:-4}
pids=()
for part in ${PARTS:-convert}; do for m in $MIXERS; do
  while [ "$(jobs -rp | wc -l)" -gt "$MAX_CHAINS" ]; do sleep 5; done  # + the merger
  timeout -s TERM $(left) python scripts/convert_compare.py --parts=$part \
    --out=$W/chain_$m --data=$DATA --teacher_config=$TEACHER_CONFIG \
    --eval_batches=$EVAL_BATCHES --seeds=$(echo $SEEDS | tr ' ' ,) \
    --mixers=$m --teacher_dir="$W/teacher_seed{seed}" --results=$W/res_${part}_$m.json \
    ${CHAIN_EXTRA:-} > $W/${part}_$m.log 2>&1 &
  pids+=($!)
done; done
for p in "${pids[@]}"; do wait $p; echo "chain $p rc $? at $(( $(date +%s) - t0 )) s"; done
kill $MERGER; merge
shopt -s nullglob  # a part not run has no logs
for f in $W/scratch_*.log $W/convert_*.log; do echo "== $f"; grep -v '^\$' $f | tail -4; done > $OUT/convert_log.txt
# a failed chain's own log names the error (convert_compare's "failed (1); see ...")
for f in $W/chain_*/log.txt; do echo "== $f"; tail -n 25 "$f"; done > $OUT/chain_logs.txt
cat $OUT/convert_log.txt | cut -c1-300
