#!/usr/bin/env bash
# Issue 19, one H200 call: 3 softmax teachers (configs/shakespeare_char_gpu.py, 5,000
# steps, seeds 0-2), then every (seed, mixer) conversion of scripts/convert_compare.py at
# once (250 + 250 steps, 10% of the teacher's tokens). The same mixers trained from
# scratch for 500 steps need no teacher, so they start at once, beside the teachers.
# TEACHERS=population (default) trains the three teachers as one training.population
# program (the same runs as train.py's, one jitted program: three train.py processes at
# once took 268 s in session 17); TEACHERS=processes as three train.py processes.
# Every process runs without preallocation so they share the GPU. Results:
# $OUT/convert_results.json (merged every 20 s, so a call cut at its limit still returns
# what finished), $OUT/convert_log.txt. Env: SEEDS, MIXERS, BUDGET, TEACHER_EXTRA (train.py
# or population overrides of the teachers), CHAIN_EXTRA (convert_compare options).
#   carry: .whl2 .jobs     run from the repository root
set -u
pip install -q --no-index --no-deps --target /tmp/site_ml .whl2/ml_collections*.whl
export PYTHONPATH=/tmp/site_ml:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
W=/tmp/cmp; rm -rf "$W"; mkdir -p "$W"
SEEDS=${SEEDS:-0 1 2}; MIXERS=${MIXERS:-hedgehog based gated_deltanet}
common="--config.data.files=.jobs/input.txt --config.train.eval_batches=200
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
pids=()
for s in $SEEDS; do for m in $MIXERS; do
  timeout -s TERM $(left) python scripts/convert_compare.py --parts=scratch \
    --out=$W/chain_${m}_$s --data=.jobs/input.txt --seeds=$s --mixers=$m \
    --results=$W/res_scratch_${m}_$s.json ${CHAIN_EXTRA:-} > $W/scratch_${m}_$s.log 2>&1 &
  pids+=($!)
done; done
if [ "${TEACHERS:-population}" = population ]; then
  lr=$(python -c "from configs.shakespeare_char_gpu import get_config; print(get_config().train.lr)")
  timeout -s TERM $(left) python -m training.population \
    --config=configs/shakespeare_char_gpu.py --workdir=$W/teachers --lrs=$lr \
    --seeds=$(echo $SEEDS | tr ' ' ,) $common ${TEACHER_EXTRA:-} > $W/teachers.log 2>&1
  for s in $SEEDS; do ln -s "$(ls -d $W/teachers/lr*_seed$s)" $W/teacher_seed$s; done
else
  tpids=()
  for s in $SEEDS; do
    python train.py --config=configs/shakespeare_char_gpu.py --workdir=$W/teacher_seed$s \
      --config.train.seed=$s $common ${TEACHER_EXTRA:-} > $W/teacher_seed$s.log 2>&1 &
    tpids+=($!)
  done
  wait "${tpids[@]}"
fi
echo "teachers done at $(( $(date +%s) - t0 )) s"; tail -n 3 $W/teacher*.log
for s in $SEEDS; do for m in $MIXERS; do
  timeout -s TERM $(left) python scripts/convert_compare.py --parts=convert \
    --out=$W/chain_${m}_$s --data=.jobs/input.txt \
    --seeds=$s --mixers=$m --teacher_dir="$W/teacher_seed{seed}" \
    --results=$W/res_${m}_$s.json ${CHAIN_EXTRA:-} > $W/chain_${m}_$s.log 2>&1 &
  pids+=($!)
done; done
for p in "${pids[@]}"; do wait $p; echo "chain $p rc $? at $(( $(date +%s) - t0 )) s"; done
kill $MERGER; merge
for f in $W/scratch_*.log $W/chain_*.log; do echo "== $f"; grep -v '^\$' $f | tail -4; done > $OUT/convert_log.txt
cat $OUT/convert_log.txt | cut -c1-300
