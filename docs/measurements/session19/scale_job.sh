#!/usr/bin/env bash
# Issue 23, prepared for a machine of N GPUs (kind nvidia-h200-x2: N=2; x4, x8 likewise),
# one call of at most 10 minutes. Not yet run. Each part is skipped when the time left
# would not cover it.
# A. Losses against one GPU: configs/shakespeare_char_gpu.py for 200 steps (losses logged
#    every 10) for softmax, gated_deltanet and the 1-in-8 hybrid (8 layers) on one GPU
#    (CUDA_VISIBLE_DEVICES=0) and with mesh data=N, fsdp=N and tensor=2 x data=N/2: four
#    processes at once (the figure is the losses, not the speed), each running the mixers
#    in turn. The fsdp run checkpoints at steps 100 and 200.
# B. Weak scaling: 8-layer d1024 T2048 (scripts/train_speed.py's d1024_T2048 row), batch
#    4 per GPU, softmax and gated_deltanet, on one GPU, then data=N, then fsdp=N, alone on
#    the machine, 60 steps each; tokens/s per GPU = the logged rate / N. nvidia-smi samples
#    every GPU's memory meanwhile (peak per row in mem_*.txt).
# C. Resume on one GPU: part A's fsdp=N gated_deltanet workdir without its step-200
#    checkpoint, resumed on one GPU to step 200; its losses against the N-GPU run's.
# Results: $OUT/losses_*/train_speed.json, $OUT/weak_*/train_speed.json, $OUT/mem_*.txt,
# $OUT/resume.json, and the summary table printed at the end.
#   env: N (default: the GPUs nvidia-smi lists), BUDGET (s, default 560), PARTS (default
#   "A B C"; A and C in one call and B in another leave each more time), STEPS (A's, 200),
#   WEAK_STEPS (B's, 60), SMALL (train.py flags added to A and C, for a CPU dry run:
#   XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu N=2)
#   carry: .whl .jobs     run from the repository root
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
N=${N:-$(nvidia-smi -L | wc -l)}
PARTS=${PARTS:-A B C}; STEPS=${STEPS:-200}; WEAK_STEPS=${WEAK_STEPS:-60}; SMALL=${SMALL:-}
has() { [[ " $PARTS " == *" $1 "* ]]; }
BUDGET=${BUDGET:-560}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
echo "N=$N devices; $(nvidia-smi -L 2>/dev/null | head -1)"
TEXT=$PWD/.jobs/input.txt  # absolute, as train_speed.py passes it (C resumes its run)
MIXERS=softmax,gated_deltanet,hybrid
declare -A MESH=(
  [one]="--config.mesh.data=1"
  [data]="--config.mesh.data=$N"
  [fsdp]="--config.mesh.data=1 --config.mesh.fsdp=$N"
  [tensor]="--config.mesh.data=$((N / 2)) --config.mesh.tensor=2"
)
# One device: CUDA_VISIBLE_DEVICES on the GPUs, the simulated count in a CPU dry run.
one_device() {
  if [ "${JAX_PLATFORMS:-}" = cpu ]; then
    echo "XLA_FLAGS=--xla_force_host_platform_device_count=1"
  else
    echo "CUDA_VISIBLE_DEVICES=0"
  fi
}
all_devices() { echo "CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((N - 1)))"; }
# 8 layers for every mixer of A and C, so that the hybrid holds its softmax layer (every 8th)
LAYERS="--config.model.num_layers=8"

# ---- A: losses, four meshes at once
if has A && (( $(left) > 200 )); then
  reserve=$(has B && echo 200 || echo 30)
  pids=()
  for m in one data fsdp tensor; do
    devices=$([ $m = one ] && one_device || all_devices)
    ckpt=$([ $m = fsdp ] && echo "--config.train.checkpoint_every=$((STEPS / 2))" || echo "")
    env $devices timeout $(( $(left) - reserve )) \
      python scripts/train_speed.py --text $TEXT --out $OUT/losses_$m --rows shake \
      --mixers $MIXERS --steps $STEPS --workroot /tmp/scale/$m --tag _$m \
      --extra="${MESH[$m]} $LAYERS $SMALL $ckpt" > $OUT/losses_$m.log 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  echo "A done at $(( $(date +%s) - T0 )) s"
else
  echo "A skipped"
fi

# ---- B: weak scaling, alone
for m in one data fsdp; do
  has B || break
  if (( $(left) < 100 )); then echo "B $m skipped"; continue; fi
  devices=$([ $m = one ] && one_device || all_devices)
  gpus=$([ $m = one ] && echo 1 || echo $N)
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 \
    > $OUT/mem_$m.txt 2>/dev/null & SMI=$!
  env $devices timeout 200 python scripts/train_speed.py --text $TEXT \
    --out $OUT/weak_$m --rows d1024_T2048 --mixers softmax,gated_deltanet --steps $WEAK_STEPS \
    --workroot /tmp/scale/weak_$m --tag _$m \
    --extra="${MESH[$m]} --config.train.batch_size=$((4 * gpus))" > $OUT/weak_$m.log 2>&1
  kill $SMI
done

# ---- C: the fsdp=N gated_deltanet run resumed on one GPU from its step-100 checkpoint
src=/tmp/scale/fsdp/shake_gated_deltanet_fsdp
if has C && [ -d $src/checkpoints ] && (( $(left) > 60 )); then
  rm -rf /tmp/scale/resume && cp -r $src /tmp/scale/resume
  rm -rf /tmp/scale/resume/checkpoints/$STEPS
  env $(one_device) timeout $(( $(left) - 10 )) python train.py \
    --config=configs/shakespeare_char_gpu.py --workdir=/tmp/scale/resume \
    --config.data.files=$TEXT --config.train.steps=$STEPS --config.train.log_every=10 \
    --config.logging.wandb=disabled --config.logging.progress=False \
    --config.train.eval_every=0 --config.train.checkpoint_every=$((STEPS / 2)) \
    --config.model.mixer=gated_deltanet --config.mesh.data=1 $LAYERS $SMALL \
    > $OUT/resume.log 2>&1
  echo $? > /tmp/scale/resume_rc; echo "C rc $(cat /tmp/scale/resume_rc)"
fi

python - "$OUT" "$N" "$STEPS" <<'PY'
import json, pathlib, sys
out, n, steps = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def rows(pattern):
    res = {}
    for f in sorted(out.glob(pattern)):
        res.update(json.loads(f.read_text()))
    return res
losses = rows("losses_*/train_speed.json")
print(f"| mixer | mesh | max abs loss diff from one GPU (steps 10-{steps}) | loss at {steps} |")
print("|---|---|---|---|")
for mixer in ("softmax", "gated_deltanet", "hybrid"):
    base = dict(map(tuple, losses.get(f"shake_{mixer}_one", {}).get("losses", [])))
    for mesh in ("one", "data", "fsdp", "tensor"):
        rec = losses.get(f"shake_{mixer}_{mesh}", {})
        got = dict(map(tuple, rec.get("losses", [])))
        gap = max((abs(got[s] - base[s]) for s in got if s in base), default=float("nan"))
        print(f"| {mixer} | {mesh} | {gap:.4f} | {got.get(steps, rec.get('failed', '-'))!s:.60} |")
weak = rows("weak_*/train_speed.json")
print("\n| mixer | mesh | GPUs | tokens/s | per GPU | per GPU vs one | peak MiB per GPU |")
print("|---|---|---|---|---|---|---|")
for mixer in ("softmax", "gated_deltanet"):
    one = weak.get(f"d1024_T2048_{mixer}_one", {}).get("tokens_per_s")
    for mesh in ("one", "data", "fsdp"):
        rec = weak.get(f"d1024_T2048_{mixer}_{mesh}", {})
        gpus = 1 if mesh == "one" else n
        tps = rec.get("tokens_per_s")
        mem = out / f"mem_{mesh}.txt"
        peak = max((int(l.split(",")[1]) for l in mem.read_text().splitlines()
                    if l.count(",") == 1), default=0) if mem.exists() else 0
        if tps is None:
            print(f"| {mixer} | {mesh} | {gpus} | {str(rec.get('failed', 'not run'))[-60:]} | | | |")
            continue
        ratio = f"{tps / gpus / one:.3f}" if one else "-"
        print(f"| {mixer} | {mesh} | {gpus} | {tps:,.0f} | {tps / gpus:,.0f} | {ratio} | {peak} |")
res = pathlib.Path("/tmp/scale/resume/metrics.jsonl")
src = pathlib.Path("/tmp/scale/fsdp/shake_gated_deltanet_fsdp/metrics.jsonl")
rc = pathlib.Path("/tmp/scale/resume_rc")
if rc.exists() and rc.read_text().strip() != "0":
    print(f"\nresume on one GPU failed (rc {rc.read_text().strip()}): see resume.log")
elif res.exists() and src.exists():
    def curve(p):
        return {e["step"]: e["loss"] for e in map(json.loads, p.read_text().splitlines())
                if "loss" in e and "tokens_per_s" in e}
    a, b = curve(src), curve(res)
    common = [s for s in b if s > steps // 2 and s in a]
    gap = max((abs(a[s] - b[s]) for s in common), default=float("nan"))
    (out / "resume.json").write_text(json.dumps({"fsdp": a, "resumed_on_one": b}))
    print(f"\nresume on one GPU from the fsdp={n} step-{steps // 2} checkpoint: "
          f"{len(common)} logged steps after it, max abs loss diff {gap:.4f}")
PY
echo "all done: $(( $(date +%s) - T0 )) s"
