#!/usr/bin/env bash
# The README's main job (configs/mqar.py, 3,000 steps) as whole processes, code before
# (10e2449, a worktree at $OLD) and after the loop's host-time change, ABBA per mixer.
#   OLD=/tmp/old33 bash docs/measurements/session33/host_overhead/main_job_old_new.sh MIXER
set -u
NEW=$(cd "$(dirname "$0")/../../../.." && pwd)
run() {  # tree label
  rm -rf /tmp/mj33/$2
  ( cd "$1" && /usr/bin/time -f "%e" python train.py --config=configs/mqar.py \
      --workdir=/tmp/mj33/$2 --config.model.mixer=$MIXER --config.logging.progress=False \
      > /tmp/mj33/$2.out 2> /tmp/mj33/$2.err )
  echo "$MIXER $2 $(tail -1 /tmp/mj33/$2.err) s; $(grep -o 'final: .*' /tmp/mj33/$2.out)"
}
MIXER=$1; mkdir -p /tmp/mj33
run "$OLD" old_a; run "$NEW" new_a; run "$NEW" new_b; run "$OLD" old_b
