# session 10: d1024 T2048 train.py rows, unrolled layers (scan_layers=False), clean tree at HEAD
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl .whl2/*.whl 2>/dev/null
cd .jobs/clean
export PYTHONPATH=/tmp/site:$PWD
for mixer in softmax gated_deltanet; do
timeout 260 python3 train.py --config=configs/lm_files.py --workdir=/tmp/runs/u_$mixer \
    --config.data.files=../input.txt --config.train.steps=320 --config.train.log_every=10 \
    --config.train.eval_every=0 --config.train.checkpoint_every=0 \
    --config.logging.wandb=disabled --config.logging.progress=False \
    --config.model.d_model=1024 --config.model.num_layers=8 --config.model.num_heads=8 \
    --config.model.max_len=2048 --config.data.seq_len=2048 \
    --config.data.sample_by=paragraph --config.train.batch_size=4 \
    --config.model.mixer=$mixer --config.model.scan_layers=${SCAN:-False} > /tmp/log_$mixer 2>&1
python3 - <<PY
import json, statistics
rows = [json.loads(l) for l in open("/tmp/runs/u_$mixer/metrics.jsonl")]
rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 160]
print("$mixer", "scan=${SCAN:-False}", "median tokens/s", round(statistics.median(rates)), "n", len(rates))
PY
tail -2 /tmp/log_$mixer
done
