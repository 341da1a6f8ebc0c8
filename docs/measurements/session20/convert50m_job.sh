#!/usr/bin/env bash
# Issue 19's larger conversion, one H200 call: 3 softmax teachers of 57M parameters
# (configs/lm_files_gpu.py, seeds 0-2, one training.population program) on a corpus larger
# than tiny-Shakespeare that the GPU machine has offline: its own Python standard
# library's .py files (sorted by path, any not valid UTF-8 left out; on the H200 machine
# /usr/lib/python3.12, 574 files, 10.7 MB, 10x tiny-Shakespeare; byte-level), then each converted to hedgehog, based and gated_deltanet
# with 10% of the teacher's tokens, beside the same mixers trained from scratch for the
# same tokens (session13/convert_job.sh with this teacher and corpus).
#   carry: .whl2 .jobs     run from the repository root
# Env: STEPS (teacher steps, default 1500), BUDGET (default 570), MIXERS, SEEDS, PARTS.
set -u
mkdir -p /tmp/corpus
python - /tmp/corpus/stdlib.txt <<'PY'
import pathlib, sys, sysconfig
root = pathlib.Path(sysconfig.get_paths()["stdlib"])
files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
kept = 0
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for p in files:
        try:
            f.write(p.read_bytes().decode("utf-8"))
            kept += 1
        except UnicodeDecodeError:
            pass
print(f"corpus: {kept} of {len(files)} files from {root}, "
      f"{pathlib.Path(sys.argv[1]).stat().st_size:,} bytes")
PY
STEPS=${STEPS:-1500}
TEACHER_CONFIG=configs/lm_files_gpu.py DATA=/tmp/corpus/stdlib.txt EVAL_BATCHES=50 \
  BUDGET=${BUDGET:-570} PARTS=${PARTS:-convert scratch} \
  TEACHER_EXTRA="--config.train.steps=$STEPS ${TEACHER_EXTRA:-}" \
  bash docs/measurements/session13/convert_job.sh
