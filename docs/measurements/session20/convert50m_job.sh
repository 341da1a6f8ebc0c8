#!/usr/bin/env bash
# Issue 19's larger conversion, one H200 call: 3 softmax teachers of 57M parameters
# (configs/lm_files_gpu.py, seeds 0-2, one training.population program) on a corpus larger
# than tiny-Shakespeare that the GPU machine has offline: its own Python standard
# library's .py files (sorted by path, any not valid UTF-8 left out; on the H200 machine
# /usr/lib/python3.12, 574 files, 10.7 MB, 10x tiny-Shakespeare; byte-level), then each
# converted to hedgehog, based and gated_deltanet with 10% of the teacher's tokens,
# beside the same mixers trained from scratch for the same tokens (session13/
# convert_job.sh with this teacher and corpus).
#   carry: .whl2 .jobs     run from the repository root
# Env: STEPS (teacher steps, default 1500), BUDGET (default 570), MIXERS, SEEDS, PARTS;
# SITE=1 adds the installed packages' .py files (for a longer teacher without
# repeating the text), MAX_MB caps the corpus (default 0: no cap).
set -u
mkdir -p /tmp/corpus
python - /tmp/corpus/stdlib.txt "${SITE:-0}" "${MAX_MB:-0}" <<'PY'
import pathlib, sys, sysconfig
out, site, max_mb = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
paths = sysconfig.get_paths()
roots = [pathlib.Path(paths["stdlib"])]
if site:  # the installed packages too (torch, jax, transformers, ...), after the stdlib
    roots += sorted({pathlib.Path(paths["purelib"]), pathlib.Path(paths["platlib"])})
files = []
for i, root in enumerate(roots):
    files += sorted(p for p in root.rglob("*.py") if i > 0 or "site-packages" not in p.parts)
kept, size, limit = 0, 0, max_mb * 2**20
with open(out, "w", encoding="utf-8") as f:
    for p in files:
        try:
            data = p.read_bytes()
            text = data.decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if limit and size + len(data) > limit:
            break
        f.write(text)
        kept, size = kept + 1, size + len(data)
print(f"corpus: {kept} of {len(files)} files from {', '.join(map(str, roots))}, "
      f"{pathlib.Path(out).stat().st_size:,} bytes")
PY
STEPS=${STEPS:-1500}
TEACHER_CONFIG=configs/lm_files_gpu.py DATA=/tmp/corpus/stdlib.txt EVAL_BATCHES=50 \
  BUDGET=${BUDGET:-570} PARTS=${PARTS:-convert scratch} \
  TEACHER_EXTRA="--config.train.steps=$STEPS ${TEACHER_EXTRA:-}" \
  bash docs/measurements/session13/convert_job.sh
