#!/usr/bin/env bash
# Issue 18's anchor, one H200 call: HazyResearch/zoology's own code (zoology_anchor.py,
# the tree in .jobs/zoology, its wheels in .whl2) and ours (training.population with
# configs/mqar_zoology_paper.py) side by side on the one GPU, the same recipe: MQAR
# (256, 16), d_model 128, batch 256, lr 2.1544e-3 (Zoology's grid point 3 of 4), seeds
# 0, 1, 2, 1,955 steps (5 epochs of Zoology's 100k examples; ours draws fresh examples),
# float32, cosine to 0. Mixers: Zoology attention / based / gated_delta_net against our
# softmax (1 head) / taylor (1 head, feature dim 8) / gated_deltanet (2 heads).
# OURS (name:heads ...), ZOOLOGY (comma list, or none) and PARALLEL pick other rows
# (session 17: OURS="gated_deltanet:2 deltanet:2" ZOOLOGY=gated_delta_net,delta_net
# PARALLEL=6). LRS: a comma list of lrs for both sides (default 2.1544347e-3).
#   carry: .whl2 .jobs     run from the repository root; results under $OUT
set -u
pip install -q --no-index --no-deps --target /tmp/site_ml .whl2/ml_collections*.whl
pip install -q --no-index --no-deps --target /tmp/site .whl2/*.whl
W=/tmp/anchor_runs
rm -rf "$W"; mkdir -p "$W" "$OUT/ours"
STEPS=${STEPS:-1955}
BUDGET=${BUDGET:-540}
LRS=${LRS:-2.1544347e-3}
for spec in ${OURS:-softmax:1 taylor:1 gated_deltanet:2}; do
  name=${spec%%:*}; heads=${spec##*:}
  # Ours take a fixed share of the GPU at start, before Zoology's processes start (they
  # first generate the data, ~50 s): preallocating 0.18 each beside nine Zoology runs
  # left those too little (session 12), and growing on demand beside six left ours too
  # little (session 17: a 3-member step asks ~15.3 GiB at vocabulary 8,192). Set
  # OURS_MEM to the share of each of our processes and PARALLEL so that all fit.
  PYTHONPATH=/tmp/site_ml:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=${OURS_MEM:-0.18} \
    XLA_PYTHON_CLIENT_PREALLOCATE=true \
    timeout -s TERM "$BUDGET" python -m training.population \
      --config=configs/mqar_zoology_paper.py --workdir="$W/$name" \
      --lrs="$LRS" --seeds=0,1,2 --config.model.mixer="$name" \
      --config.model.num_heads="$heads" --config.train.steps="$STEPS" \
      --config.train.eval_every=0 --config.train.checkpoint_every=0 \
      --config.train.log_every=100 --config.logging.wandb=disabled \
      --config.logging.progress=False \
      > "$OUT/ours/$name.out" 2> "$OUT/ours/$name.err" &
done
mkdir -p "$OUT/zoology"
if [ "${ZOOLOGY:-}" != none ]; then  # ZOOLOGY=none: ours alone
PYTHONPATH=/tmp/site:.jobs/zoology PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  python docs/measurements/session12/zoology_anchor.py \
  --mixers=${ZOOLOGY:-attention,based,gated_delta_net} --seeds=0,1,2 --lrs=$LRS \
  --steps="$STEPS" --epochs=5 --parallel=${PARALLEL:-9} --budget_s="$BUDGET" --out="$OUT/zoology" \
  > "$OUT/zoology.out" 2>&1 &
fi
wait
# At most 8 files come back from $OUT: every run's files go back as one archive.
tar -czf "$OUT/anchor_runs.tgz" -C "$OUT" ours zoology
for f in "$OUT"/ours/*.out; do echo "== $f"; grep -v "^step [0-9]*:" "$f" | tail -8; grep "^step" "$f" | tail -2; done
for f in "$OUT"/ours/*.err; do echo "== $f"; tail -3 "$f"; done
[ -f "$OUT/zoology.out" ] && { echo "== zoology"; tail -30 "$OUT/zoology.out"; }
rm -rf "$OUT/ours" "$OUT/zoology"
