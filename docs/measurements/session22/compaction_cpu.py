"""Population steps before and after half the members stop, with stopped members parked
(park="always") and with them kept in the step, frozen (park="never"),
on this CPU: configs/mqar.py (the README's main job), lrs 0 and 3e-3 x seeds 0, 1; lr 0
never improves, so with patience 1 its members stop at the second evaluation (step 200).
Prints the wall seconds of steps 101-200 (4 members training) and 301-400 (2).

    PYTHONPATH=$PWD python docs/measurements/session22/compaction_cpu.py [parked|kept]
"""
import sys
import tempfile
import time

from training import population

mode = sys.argv[1] if len(sys.argv) > 1 else "parked"
park = {"parked": "always", "kept": "never"}[mode]
marks = {}
original = population._Population.flush


def flush(self, *, log_now):
    original(self, log_now=log_now)
    step = max(r.step for r in self.runs)
    marks.setdefault(step, time.perf_counter())


population._Population.flush = flush
from configs import mqar  # noqa: E402

c = mqar.get_config()
c.train.update(dict(steps=400, eval_every=100, early_stop_patience=1, log_every=100,
                    checkpoint_every=0, eval_batches=4))
c.logging.progress = False
with tempfile.TemporaryDirectory() as d:
    population.train_population(c, d, (0.0, 3e-3), (0, 1), park=park)
steps = sorted(marks)
at = {s: marks[s] for s in steps}
print(mode, f"steps 101-200 (4 training): {at[200] - at[100]:.2f} s for 100 steps;",
      f"steps 301-400 (2 training): {at[400] - at[300]:.2f} s for 100 steps")
