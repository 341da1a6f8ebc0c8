"""Session 10's H200 job for issues 17 and 18: three parts, one command each.

  mqar       issue 17's check. MQAR (256, 16), vocabulary 8,192, d_model 128, 2 heads, no
             MLP, Zoology's layout (configs/mqar_zoology.py: layer 0 base_conv, layer 1
             the mixer), bfloat16, batch 128, b2 0.99, 2,000 steps (configs/
             compare_mqar.py:zoology's run), lr 1e-3 / 3e-3 / 1e-2 x seeds 0, 1, 2: one
             population (`python -m training.population`, 9 members) for each of linear,
             hedgehog, performer and lightning, and reference rows softmax and
             gated_deltanet at lr 3e-3 (where both learned this task at d128 in
             docs/results.md; --ref_lrs=1e-3,3e-3,1e-2 for the full grid), every
             population a process of its own, all at once on the one GPU
             (XLA_PYTHON_CLIENT_MEM_FRACTION 0.9 / 6 = 0.15 each, no preallocation).
             train.grad_accum=2 (the gradient of the whole batch of 128, in two
             microbatches: half the activation memory, so six populations fit; a
             population that still runs out of memory before its first step is started
             again at 4). Then every member is evaluated from its newest checkpoint, one
             process per population: `val` = the sweeps' MQAR metric (sweeps/tasks.py:
             masked accuracy on the run's held-out stream, dataset.eval_batches) and
             `test` = eval/recall.py's (fresh examples drawn from seed 1234, which no
             training stream uses), 1,024 examples (16,384 queries) each. Per mixer the
             lr with the best mean val accuracy is picked, and its test accuracy is
             reported as the mean over seeds with a 95% t-interval, against the 1/16
             floor.
  speed      issue 18's check: one 12-member population (lrs 1e-4, 4.6e-4, 2.2e-3, 1e-2 =
             Zoology's logspace(-4, -2, 4), x seeds 0, 1, 2) of the same MQAR model
             (linear; --speed_mixer) against the same 12 runs through train.py one
             after another, 300 steps each, whole batch: each whole's wall time (process
             start, compiles, final eval and save included) and the steady-state speed
             from metrics.jsonl (step 1 and the first log_every interval, which hold the
             compile, left out), as ratios. The population runs first; if the 12
             separate runs do not all fit the budget, the ones that ran are extrapolated
             and the output says so.
  performer  issue 17's Shakespeare check: performer on configs/shakespeare_char_gpu.py
             with 8 layers, seeds 0, 1, 2 as one population at the config's lr (1e-3),
             on the config's own 5,000-step schedule (so the lr follows the recipe's
             curve), stopped by SIGTERM when the budget runs out (it saves and exits);
             prints final train / eval losses per seed, the eval curve, whether any value
             was non-finite and whether the (smoothed) training loss rose by > 0.2 (a
             rising eval loss alone is overfitting: the 8-layer runs overfit from ~500
             steps). Falls back to three train.py processes if the population fails
             before its first step.

On the H200 (repository root; ml_collections from the carried wheel). Run speed first:
it prints what one member-step costs, a check on part mqar's --steps.

    pip install --no-index --no-deps --target /tmp/site .whl2/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    python docs/measurements/session10/job_17_18.py --part=speed --out=$OUT
    python docs/measurements/session10/job_17_18.py --part=mqar --out=$OUT
    python docs/measurements/session10/job_17_18.py --part=performer --out=$OUT \\
        --text=.jobs/input.txt

CPU check of the machinery (tiny models; 2-3 minutes each on the shared 2-core machine;
part mqar's tiny default is linear, performer and softmax at 2 lrs x 2 seeds, and
--mixers=hedgehog,lightning --refs=gated_deltanet runs the others):

    python docs/measurements/session10/job_17_18.py --part=mqar --tiny --out=/tmp/j
    python docs/measurements/session10/job_17_18.py --part=speed --tiny --out=/tmp/j
    python docs/measurements/session10/job_17_18.py --part=performer --tiny --out=/tmp/j \\
        --text=.jobs/input.txt

Each part has a wall budget (--budget; mqar 480 s, speed 480 s, performer 300 s, all
under the GPU machine's 600 s a command): no new work starts when what is left is too
short for it, and when the training share runs out every training process still running
gets SIGTERM (training.population and train.py save a checkpoint and exit), so the
evaluation has something to read (part mqar keeps the last 70 s, --eval_reserve, for
it). In part mqar the reference rows yield first: when a primary mixer's projected finish
passes the training deadline, the slowest reference population still running is
stopped (its members are evaluated at the step they reached, and the table says "cut
at step s"). Results go to OUT/<part>.json, rewritten every second and after every
event, so a job cut short still leaves data; each subprocess's stdout and stderr are in
OUT/logs/, and the stderr tail of any that fails is printed. Checkpoints live under
--workroot (default /tmp/job_17_18_runs), not in OUT, and are deleted at the start of
each part (a fresh run every time). --impl=chunk (no Pallas kernels) and --set=KEY=VALUE
(any config override, every training process of the part) change what runs without
editing this file.

Expected on the H200 (estimates from first principles and the H200 runs in
docs/results.md; see session 10's report): speed ~350-400 s (12 x ~25 s separate runs,
~60 s population); mqar ~360 s at 2,000 steps (startup and compile ~60 s, ~130 ms a
step for all six populations together, evaluation ~40 s; if the GPU is twice as slow,
the references yield and then the deadline cuts the primaries near step 1,600);
performer = its budget, 300 s, about 1,500-2,000 of the 5,000 steps.

The driver itself needs only the standard library and numpy; the workers it launches
(training.population, train.py, and this file's own `--part=_eval`) import the repository.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[3]
PY = sys.executable
T0 = time.time()

# Two-sided 95% Student t quantiles, t_{0.975, df}.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}
MQAR_FLOOR = 1 / 16  # "any value from the context" at (256, 16)
SIGTERM_RC = 128 + signal.SIGTERM
STEP_LINE = re.compile(r"^step (\d+):", re.M)
# Zoology's lr grid, numpy.logspace(-4, -2, 4) rounded (configs/compare_mqar.py LRS).
ZOOLOGY_LRS = "1e-4,4.6e-4,2.2e-3,1e-2"
PRIMARY = "linear,hedgehog,performer,lightning"
REFERENCE = "softmax,gated_deltanet"


# ------------------------------------------------------------------------------ helpers
def say(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def write_json(path: pathlib.Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, pathlib.Path):
        return str(x)
    return str(x)


def t_interval(xs) -> tuple[float, float, int]:
    """(mean, half-width of the two-sided 95% t-interval, n); half-width NaN for n < 2."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(np.mean(xs))
    if n < 2:
        return mean, math.nan, n
    df = n - 1
    t = T975[max(k for k in T975 if k <= df)] if df <= 30 else 1.96
    return mean, t * float(np.std(xs, ddof=1)) / math.sqrt(n), n


def read_metrics(workdir: pathlib.Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def as_float(v) -> float:
    try:
        return float(v)  # metrics.jsonl writes non-finite values as "nan" / "inf"
    except (TypeError, ValueError):
        return math.nan


def steady_steps_per_s(entries: list[dict], tokens_per_step: int) -> float | None:
    """Steps/s over the logged training intervals after the first one: each training
    entry's tokens_per_s is the rate since the previous log (the clock restarts after step
    1, whose entry holds the compile), so entries past the first two (step 1 and the
    first log_every interval) are weighted by their steps: sum(steps) / sum(time)."""
    train = sorted((e for e in entries if "loss" in e and "tokens_per_s" in e),
                   key=lambda e: e["step"])
    steps = time_s = 0.0
    for prev, cur in zip(train[1:], train[2:]):
        d = cur["step"] - prev["step"]
        rate = as_float(cur["tokens_per_s"]) / tokens_per_step
        if d > 0 and rate > 0 and math.isfinite(rate):
            steps += d
            time_s += d / rate
    return steps / time_s if time_s > 0 else None


def gpu_info() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 (no GPU: the CPU check)
        return "no nvidia-smi"


def child_env(mem_fraction: float | None = None, preallocate: bool = True,
              cache_dir: pathlib.Path | None = None) -> dict:
    """The workers' environment. cache_dir: jax's persistent compilation cache for that
    process alone (a population compiles each member's init separately, and members of
    one seed compile the same program; the eval worker's members share one forward)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")]
                                                      if p])
    env.update(WANDB_MODE="disabled", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    if cache_dir is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if mem_fraction is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{mem_fraction:.3f}"
    if not preallocate:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


class Proc:
    """A subprocess with its stdout / stderr in LOGDIR/NAME.out / .err, its progress (the
    newest "step N:" line of its stdout, as training.population and train.py print with
    logging.progress=False) and why the driver stopped it, if it did."""

    def __init__(self, name: str, cmd: list[str], logdir: pathlib.Path, env: dict):
        self.name, self.cmd = name, cmd
        self.out_path, self.err_path = logdir / f"{name}.out", logdir / f"{name}.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self._out.write("$ " + " ".join(cmd) + "\n")
        self._out.flush()
        self.t0 = time.time()
        self.popen = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._out,
                                      stderr=self._err)
        self.rc: int | None = None
        self.t_end: float | None = None
        self.stopped: str | None = None  # why the driver sent SIGTERM
        self.t_stop: float | None = None
        self.killed = False
        self.progress: list[tuple[float, int]] = []
        say(f"started {name} (pid {self.popen.pid})")

    def poll(self) -> bool:
        """True while running."""
        if self.rc is None:
            rc = self.popen.poll()
            if rc is not None:
                self.rc, self.t_end = rc, time.time()
                self._out.close()
                self._err.close()
                self.update_progress()
                say(f"{self.name} exited rc={rc} after {self.wall:.0f}s"
                    + (f" (stopped: {self.stopped})" if self.stopped else ""))
                if rc != 0 and not (self.stopped and rc in (SIGTERM_RC, -signal.SIGTERM,
                                                            -signal.SIGKILL)):
                    print(f"----- {self.name} FAILED (rc {rc}); stderr tail:\n"
                          f"{self.tail()}\n-----", flush=True)
        return self.rc is None

    @property
    def wall(self) -> float:
        return (self.t_end or time.time()) - self.t0

    @property
    def step(self) -> int:
        return self.progress[-1][1] if self.progress else 0

    def update_progress(self) -> None:
        try:
            text = self.out_path.read_text(errors="replace")
        except OSError:
            return
        found = STEP_LINE.findall(text)
        if found:
            step = int(found[-1])
            if not self.progress or step != self.progress[-1][1]:
                self.progress.append((time.time(), step))

    def rate(self, window_s: float = 40.0) -> float | None:
        """Steps/s over the progress seen in the last window_s (at least two points 5 s
        apart past the first log, whose step holds the compile)."""
        pts = self.progress[1:]
        if len(pts) < 2:
            return None
        now = pts[-1][0]
        recent = [p for p in pts if now - p[0] <= window_s]
        if len(recent) < 2 or recent[-1][0] - recent[0][0] < 5:
            recent = pts
        dt, ds = recent[-1][0] - recent[0][0], recent[-1][1] - recent[0][1]
        return ds / dt if dt >= 5 and ds > 0 else None

    def terminate(self, why: str) -> None:
        if self.rc is None and self.stopped is None:
            self.stopped, self.t_stop = why, time.time()
            say(f"SIGTERM {self.name}: {why}")
            try:
                self.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_if_stuck(self, grace_s: float) -> None:
        if (self.rc is None and self.t_stop is not None and not self.killed
                and time.time() - self.t_stop > grace_s):
            say(f"SIGKILL {self.name}: no exit {grace_s:.0f}s after SIGTERM")
            self.killed = True
            self.popen.kill()

    def tail(self, n: int = 3000) -> str:
        for path in (self.err_path, self.out_path):
            try:
                text = path.read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                return text[-n:]
        return "(no output)"


def run_to_end(procs: list[Proc], deadline: float, grace_s: float, why: str) -> None:
    """Waits for procs (polled every 0.2 s: their wall times are within that); SIGTERM at
    deadline, SIGKILL grace_s later."""
    while any([p.poll() for p in procs]):  # a list: every one polled
        for p in procs:
            p.update_progress()
            if time.time() > deadline:
                p.terminate(why)
            p.kill_if_stuck(grace_s)
        time.sleep(0.2)


def fresh_dir(path: pathlib.Path) -> pathlib.Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def member_dirs(popdir: pathlib.Path) -> list[pathlib.Path]:
    """A population's member workdirs, in its lr-major order (lr, then seed)."""
    dirs = []
    for d in popdir.glob("lr*_seed*"):
        cfg = d / "config.json"
        if cfg.is_file():
            c = json.loads(cfg.read_text())
            dirs.append((float(c["train"]["lr"]), int(c["train"]["seed"]), d))
    return [d for _, _, d in sorted(dirs)]


def member_summary(d: pathlib.Path) -> dict:
    """What a member's metrics.jsonl says: last training step and loss, its last eval
    (the population's own final eval when it finished), any non-finite value."""
    c = json.loads((d / "config.json").read_text())
    entries = read_metrics(d)
    train = [e for e in entries if "loss" in e]
    evals = [e for e in entries if "eval_loss" in e]
    non_finite = [e["step"] for e in train
                  if not (math.isfinite(as_float(e["loss"]))
                          and math.isfinite(as_float(e.get("grad_norm", 0.0))))]
    return {"member": d.name, "lr": float(c["train"]["lr"]), "seed": int(c["train"]["seed"]),
            "logged_step": train[-1]["step"] if train else 0,
            "last_loss": as_float(train[-1]["loss"]) if train else math.nan,
            "pop_eval_step": evals[-1]["step"] if evals else None,
            "pop_eval_accuracy": as_float(evals[-1].get("eval_accuracy")) if evals else None,
            "pop_eval_loss": as_float(evals[-1]["eval_loss"]) if evals else None,
            "non_finite_steps": non_finite[:5]}


# ------------------------------------------------------------------------ part: mqar
def mqar_overrides(a, steps: int, lr_eval_batches: int,
                   grad_accum: int | None = None) -> list[str]:
    """compare_mqar.py:zoology's run at d128 (its `overrides`, setting and width), with
    eval_batches set so the population's own final eval holds >= eval_examples."""
    if a.tiny:  # seconds per step on 2 CPU cores
        o = {"model.d_model": 16, "model.num_heads": 2, "data.seq_len": 32,
             "data.num_kv_pairs": 2, "data.vocab_size": 64, "train.batch_size": 8,
             "train.log_every": 5}
    else:
        o = {"model.d_model": 128, "model.num_heads": 2, "data.seq_len": 256,
             "data.num_kv_pairs": 16, "data.vocab_size": 8192, "train.batch_size": 128,
             "train.log_every": 50}
    o.update({"model.num_layers": 2, "model.mlp": False, "train.steps": steps,
              "train.precision": "bfloat16", "train.b2": 0.99,
              "train.eval_every": max(steps // 2, 1), "train.checkpoint_every": max(steps // 2, 1),
              "train.eval_batches": lr_eval_batches, "train.grad_accum": grad_accum or a.grad_accum,
              "logging.wandb": "disabled", "logging.progress": False})
    if a.impl != "auto":
        o["model.impl"] = a.impl
    return [f"--config.{k}={v}" for k, v in o.items()] + extra(a)


def extra(a) -> list[str]:
    """--set KEY=VALUE flags, passed to every training process of the part."""
    return [f"--config.{kv}" for kv in a.set]


def part_mqar(a, out: pathlib.Path, work: pathlib.Path) -> dict:
    t_start = time.time()
    deadline = t_start + a.budget
    train_deadline = deadline - a.eval_reserve
    steps = a.steps or (30 if a.tiny else 2000)
    batch = 8 if a.tiny else 128
    examples = a.eval_examples or (64 if a.tiny else 1024)
    eval_batches = math.ceil(examples / batch)
    primaries = [m for m in a.mixers.split(",") if m]
    refs = [m for m in a.refs.split(",") if m]
    queue = primaries + refs
    parallel = a.parallel or len(queue)
    frac = a.mem_fraction or round(0.9 / max(min(parallel, len(queue)), 1), 3)
    overrides = mqar_overrides(a, steps, eval_batches)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    root = fresh_dir(work / "mqar")
    res = {"part": "mqar", "gpu": gpu_info(), "steps": steps, "lrs": a.lrs,
           "ref_lrs": a.ref_lrs, "seeds": a.seeds,
           "primaries": primaries, "references": refs, "overrides": overrides,
           "mem_fraction": frac, "budget_s": a.budget, "eval_examples": examples,
           "populations": {}, "members": [], "summary": []}
    path = out / "mqar.json"
    write_json(path, res)
    say(f"mqar: {len(queue)} populations ({', '.join(primaries)} at lrs {a.lrs}; "
        f"{', '.join(refs) or 'no references'} at lrs {a.ref_lrs}) x seeds {a.seeds}, "
        f"{steps} steps, at most {parallel} processes at "
        f"once, XLA_PYTHON_CLIENT_MEM_FRACTION={frac}; training deadline "
        f"{train_deadline - t_start:.0f}s, part deadline {a.budget:.0f}s")
    pops: dict[str, Proc] = {}
    evals: dict[str, Proc | None] = {}  # None: ended with nothing to evaluate
    accum = {m: a.grad_accum for m in queue}  # doubled on a retry after out-of-memory
    retried: dict[str, str] = {}
    last_yield = 0.0

    def record():
        for m, p in pops.items():
            res["populations"][m] = {
                "rc": p.rc, "wall_s": round(p.wall, 1), "step": p.step,
                "steps_per_s": p.rate(1e9), "stopped": p.stopped,
                "role": "reference" if m in refs else "primary",
                "grad_accum": accum[m], "retried": retried.get(m),
                "eval_rc": evals[m].rc if evals.get(m) is not None else None,
                "failed_tail": p.tail(1500) if p.rc not in (None, 0) and not p.stopped
                else None}
        write_json(path, res)

    while True:
        now = time.time()
        running = [p for p in list(pops.values()) + list(evals.values())
                   if p is not None and p.poll()]
        # A population out of device memory before its first logged step starts again
        # (fresh) with twice the microbatches, if time allows.
        for m, p in list(pops.items()):
            if (p.rc not in (None, 0) and not p.stopped and m not in retried and p.step == 0
                    and re.search(r"RESOURCE_EXHAUSTED|[Oo]ut of memory", p.tail(20000))
                    and train_deadline - now > a.min_launch_s
                    and batch % (2 * accum[m]) == 0):
                accum[m] *= 2
                retried[m] = f"out of memory at grad_accum {accum[m] // 2}; retried at " \
                             f"{accum[m]}"
                say(f"mqar: {m}: {retried[m]}")
                p.out_path.rename(p.out_path.with_suffix(".oom.out"))
                p.err_path.rename(p.err_path.with_suffix(".oom.err"))
                del pops[m]
                fresh_dir(root / m)
                queue.insert(0, m)
        # Training populations that ended get their evaluation (while time is left).
        for m, p in pops.items():
            if p.rc is not None and m not in evals and len(running) < parallel:
                if now < deadline - 20 and member_dirs(root / m):
                    evals[m] = Proc(f"eval_{m}", [
                        PY, str(pathlib.Path(__file__).resolve()), "--part=_eval",
                        f"--rundir={root / m}", f"--eval_json={out / f'mqar_eval_{m}.json'}",
                        f"--eval_examples={examples}", f"--eval_batch={batch}"],
                        logs, child_env(frac, preallocate=False,
                                        cache_dir=root / f".cache_eval_{m}"))
                    running.append(evals[m])
                else:
                    evals[m] = None
                record()
        # New populations, while slots and time allow.
        while queue and len(running) < parallel:
            if train_deadline - now < a.min_launch_s:
                say(f"mqar: {train_deadline - now:.0f}s of training time left, under "
                    f"--min_launch_s={a.min_launch_s:.0f}: {', '.join(queue)} not started")
                res["not_started"] = list(queue)
                queue.clear()
                break
            m = queue.pop(0)
            lrs = a.ref_lrs if m in refs else a.lrs
            pops[m] = Proc(f"pop_{m}", [
                PY, "-m", "training.population", "--config=configs/mqar_zoology.py",
                f"--workdir={root / m}", f"--lrs={lrs}", f"--seeds={a.seeds}",
                f"--config.model.mixer={m}",
                *mqar_overrides(a, steps, eval_batches, accum[m])], logs,
                child_env(frac, preallocate=False, cache_dir=root / f".cache_{m}"))
            running.append(pops[m])
        training = [p for m, p in pops.items() if p.rc is None]
        for p in training:
            p.update_progress()
        # References yield to primaries projected past the training deadline.
        if a.refs_yield and now - last_yield > 30:
            late = []
            for m, p in pops.items():
                r = p.rate()
                if m in primaries and p.rc is None and r:
                    end = now + (steps - p.step) / r
                    if end > train_deadline:
                        late.append((m, end - t_start))
            going_refs = [(m, p) for m, p in pops.items() if m in refs and p.rc is None
                          and p.stopped is None]
            if late and going_refs:
                def ref_end(mp):
                    r = mp[1].rate()
                    return (steps - mp[1].step) / r if r else math.inf
                m, p = max(going_refs, key=ref_end)
                p.terminate(f"reference yields: primaries {late} projected past the "
                            f"training deadline {train_deadline - t_start:.0f}s")
                last_yield = now
        if now > train_deadline:
            for p in training:
                p.terminate(f"training deadline {train_deadline - t_start:.0f}s")
        for p in list(pops.values()) + list(evals.values()):
            if p is not None:
                p.kill_if_stuck(60)
        if now > deadline - 3:
            for p in evals.values():
                if p is not None:
                    p.terminate("part deadline")
        record()
        if not queue and all(p.rc is not None for p in pops.values()) and all(
                e is None or e.rc is not None for e in evals.values()) and all(
                m in evals for m in pops):
            break
        if now > deadline + 30:  # nothing more can be saved
            say("mqar: past the part deadline; giving up on what still runs")
            break
        time.sleep(1.0)

    # Gather: every member's population log, then its evaluation.
    members = []
    for m, p in pops.items():
        popdir = root / m
        diverged = {}
        if (popdir / "population.json").is_file():
            diverged = json.loads((popdir / "population.json").read_text()).get("diverged", {})
        ev = {}
        ev_path = out / f"mqar_eval_{m}.json"
        if ev_path.is_file():
            ev = {r["member"]: r for r in json.loads(ev_path.read_text())}
        for d in member_dirs(popdir):
            s = member_summary(d)
            e = ev.get(d.name, {})
            status = ("diverged at step %s" % diverged[d.name] if d.name in diverged
                      # a final eval at the last step: it finished (whatever the rc of
                      # a process stopped while it closed)
                      else "done" if p.rc == 0 or s["pop_eval_step"] == steps
                      else f"cut at step {e.get('step', s['logged_step'])} ({p.stopped})"
                      if p.stopped else f"failed rc {p.rc}")
            members.append(dict(s, mixer=m, status=status, step=e.get("step"),
                                val_accuracy=e.get("val_accuracy"),
                                test_accuracy=e.get("test_accuracy"),
                                val_queries=e.get("val_queries"),
                                test_queries=e.get("test_queries"),
                                eval_error=e.get("error")))
    res["members"] = members
    res["summary"] = mqar_summary(members, pops, refs)
    res["wall_s"] = round(time.time() - t_start, 1)
    record()
    print_mqar(res)
    return res


def mqar_summary(members, pops, refs) -> list[dict]:
    rows = []
    for m in pops:
        mine = [r for r in members if r["mixer"] == m]
        by_lr = {}
        for r in mine:
            by_lr.setdefault(r["lr"], []).append(r)
        per_lr = []
        for lr, rs in sorted(by_lr.items()):
            val = t_interval([r["val_accuracy"] for r in rs])
            test = t_interval([r["test_accuracy"] for r in rs])
            per_lr.append({"lr": lr, "val_mean": val[0], "test_mean": test[0],
                           "test_ci95": test[1], "n": test[2],
                           # members cut short or diverged (evaluated at their last saved
                           # step) are in the mean; these say how many
                           "not_done": sum(r["status"] != "done" for r in rs),
                           "diverged": sum(r["status"].startswith("diverged") for r in rs)})
        scored = [x for x in per_lr if math.isfinite(x["val_mean"])]
        best = max(scored, key=lambda x: x["val_mean"]) if scored else None
        row = {"mixer": m, "role": "reference" if m in refs else "primary",
               "per_lr": per_lr, "best_lr": best and best["lr"]}
        if best:
            lo = best["test_mean"] - best["test_ci95"]
            row.update(test_mean=best["test_mean"], test_ci95=best["test_ci95"],
                       n=best["n"], val_mean=best["val_mean"], not_done=best["not_done"],
                       diverged=best["diverged"],
                       above_floor=bool(math.isfinite(lo) and lo > MQAR_FLOOR))
        rows.append(row)
    return rows


def fmt(x, spec=".4f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def print_mqar(res) -> None:
    print("\n| mixer | lr | seed | step | status | val acc | test acc | pop's own eval acc |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res["members"]:
        print(f"| {r['mixer']} | {r['lr']:g} | {r['seed']} | {r['step'] or r['logged_step']} "
              f"| {r['status']} | {fmt(r['val_accuracy'])} | {fmt(r['test_accuracy'])} | "
              f"{fmt(r['pop_eval_accuracy'])} |")
    print(f"\nPer mixer, the lr with the best mean val accuracy; its test accuracy over seeds "
          f"(mean, 95% t-interval); floor 1/16 = {MQAR_FLOOR:.4f}:")
    print("| mixer | role | best lr | n (not done) | test mean | 95% CI | val mean | "
          "lower bound > 1/16 | test mean at each lr |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in res["summary"]:
        lrs = ", ".join(f"{x['lr']:g}: {fmt(x['test_mean'], '.3f')}" for x in s["per_lr"])
        if s.get("best_lr") is None:
            print(f"| {s['mixer']} | {s['role']} | - | 0 | - | - | - | - | {lrs} |")
            continue
        ci = s["test_ci95"]
        print(f"| {s['mixer']} | {s['role']} | {s['best_lr']:g} | {s['n']} "
              f"({s['not_done']}{', %d diverged' % s['diverged'] if s['diverged'] else ''}) | "
              f"{fmt(s['test_mean'])} | +-{fmt(ci)} [{fmt(s['test_mean'] - ci)}, "
              f"{fmt(s['test_mean'] + ci)}] | {fmt(s['val_mean'])} | {s['above_floor']} | "
              f"{lrs} |")
    gaps = [abs(r["val_accuracy"] - r["pop_eval_accuracy"]) for r in res["members"]
            if r["val_accuracy"] is not None and r["pop_eval_accuracy"] is not None
            and r["pop_eval_step"] == r["step"]]
    if gaps:
        print(f"reloaded val accuracy vs the population's own final eval (same examples): "
              f"max |diff| {max(gaps):.2e} over {len(gaps)} members")
    for m, p in res["populations"].items():
        print(f"{m}: rc {p['rc']}, {p['wall_s']}s, step {p['step']}, "
              f"{fmt(p['steps_per_s'], '.2f')} steps/s after the first log"
              + (f", stopped: {p['stopped']}" if p["stopped"] else ""))
    if res.get("not_started"):
        print(f"not started (no time left): {', '.join(res['not_started'])}")
    print(f"mqar part: {res['wall_s']}s", flush=True)


# ------------------------------------------------------------- worker: evaluation
def worker_eval(a) -> None:
    """One population's members from their newest checkpoints: the sweeps' val metric
    and eval/recall.py's test metric, a JSON list rewritten after every member."""
    from eval import common, recall  # (the driver's env gives it a compilation cache)

    out = pathlib.Path(a.eval_json)
    done = []
    for d in member_dirs(pathlib.Path(a.rundir)):
        t = time.time()
        rec = {"member": d.name}
        try:
            model, config, dataset, step = common.load_run(str(d))
            stats = common.token_stats_fn(common.make_logits_fn(model))
            nb = math.ceil(a.eval_examples / a.eval_batch)
            correct, total = recall.masked_accuracy(stats, dataset.eval_batches(a.eval_batch,
                                                                                nb))
            t_len, kv = int(config.data.seq_len), int(config.data.num_kv_pairs)
            grid = recall.mqar_grid(stats, recall.mqar_task(config, dataset), [(t_len, kv)],
                                    num_examples=nb * a.eval_batch, batch_size=a.eval_batch,
                                    progress=False)
            cell = grid["cells"][0]
            rec.update(lr=float(config.train.lr), seed=int(config.train.seed), step=int(step),
                       val_accuracy=correct / max(total, 1), val_queries=total,
                       val_examples=nb * a.eval_batch, test_accuracy=cell["accuracy"],
                       test_queries=cell["queries"], test_examples=nb * a.eval_batch)
        except Exception as e:  # noqa: BLE001 (one member's failure must not stop the rest)
            import traceback
            traceback.print_exc()
            rec["error"] = f"{type(e).__name__}: {e}"[:1000]
        rec["eval_s"] = round(time.time() - t, 2)
        done.append(rec)
        write_json(out, done)
        print(json.dumps(rec), flush=True)


# ------------------------------------------------------------------------ part: speed
def part_speed(a, out: pathlib.Path, work: pathlib.Path) -> dict:
    t_start = time.time()
    deadline = t_start + a.budget
    steps = a.speed_steps or (20 if a.tiny else 300)
    lrs = [float(x) for x in a.speed_lrs.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    pairs = [(lr, s) for lr in lrs for s in seeds]
    batch, seq = (8, 32) if a.tiny else (128, 256)
    tokens_per_step = batch * seq
    o = mqar_overrides(a, steps, 2 if a.tiny else 8)
    # The same job for both: no intermediate eval or checkpoint (the final eval and save
    # both do), a log every 10 steps (5 tiny), the whole batch at once.
    drop = ("train.eval_every", "train.checkpoint_every", "train.grad_accum", "train.log_every")
    o = [x for x in o if not x.split("=")[0].endswith(drop)]
    o += ["--config.train.eval_every=0", "--config.train.checkpoint_every=0",
          "--config.train.grad_accum=1", f"--config.train.log_every={5 if a.tiny else 10}",
          f"--config.model.mixer={a.speed_mixer}"]
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    root = fresh_dir(work / "speed")
    env = child_env()  # one process on the GPU at a time: jax's default memory
    res = {"part": "speed", "gpu": gpu_info(), "steps": steps, "mixer": a.speed_mixer,
           "lrs": lrs, "seeds": seeds, "overrides": o, "budget_s": a.budget,
           "population": {}, "separate": []}
    path = out / "speed.json"
    write_json(path, res)
    say(f"speed: population of {len(pairs)} ({a.speed_mixer}), {steps} steps, then the same "
        f"{len(pairs)} runs through train.py one after another")

    p = Proc("speed_population", [PY, "-m", "training.population",
                                  "--config=configs/mqar_zoology.py", f"--workdir={root / 'pop'}",
                                  f"--lrs={','.join(map(str, lrs))}",
                                  f"--seeds={','.join(map(str, seeds))}", *o], logs, env)
    run_to_end([p], t_start + a.budget * 0.45, 30, "speed: population past 45% of the budget")
    pop_members = {}
    rates = []
    for d in member_dirs(root / "pop"):
        s = member_summary(d)
        pop_members[(s["lr"], s["seed"])] = s
        r = steady_steps_per_s(read_metrics(d), tokens_per_step)
        if r:
            rates.append(r)
    pop_rate = float(np.median(rates)) if rates else None
    res["population"] = {"rc": p.rc, "wall_s": round(p.wall, 1), "stopped": p.stopped,
                         "members": len(pop_members), "steps_per_s": pop_rate,
                         "member_steps_per_s": pop_rate * len(pairs) if pop_rate else None,
                         "failed_tail": p.tail(1500) if p.rc else None}
    write_json(path, res)

    for i, (lr, seed) in enumerate(pairs):
        walls = [r["wall_s"] for r in res["separate"] if r["rc"] == 0]
        guess = max(walls) if walls else 30.0
        left = deadline - time.time()
        if left < 1.1 * guess + 5:
            say(f"speed: {left:.0f}s left, a run takes ~{guess:.0f}s: stopping after {i} "
                f"separate runs")
            break
        wd = root / f"run_lr{lr:g}_seed{seed}"
        q = Proc(f"speed_run{i:02d}", [PY, "train.py", "--config=configs/mqar_zoology.py",
                                       f"--workdir={wd}", f"--config.train.lr={lr}",
                                       f"--config.train.seed={seed}", *o], logs, env)
        run_to_end([q], deadline - 2, 15, "speed: part deadline")
        ent = read_metrics(wd)
        train = [e for e in ent if "loss" in e]
        rec = {"lr": lr, "seed": seed, "rc": q.rc, "wall_s": round(q.wall, 1),
               "steps_per_s": steady_steps_per_s(ent, tokens_per_step),
               "last_step": train[-1]["step"] if train else 0,
               "last_loss": as_float(train[-1]["loss"]) if train else None}
        pm = pop_members.get((lr, seed))
        if pm and train and pm["logged_step"] == rec["last_step"]:
            rec["pop_last_loss"] = pm["last_loss"]
            rec["loss_gap"] = abs(pm["last_loss"] - rec["last_loss"])
        res["separate"].append(rec)
        write_json(path, res)

    ok = [r for r in res["separate"] if r["rc"] == 0]
    k = len(ok)
    summary = {"separate_runs": k, "of": len(pairs)}
    if k:
        seq_wall = sum(r["wall_s"] for r in ok)
        summary["extrapolated"] = k < len(pairs)
        summary["separate_wall_s"] = seq_wall * len(pairs) / k
        seq_rates = [r["steps_per_s"] for r in ok if r["steps_per_s"]]
        summary["separate_steps_per_s"] = float(np.mean(seq_rates)) if seq_rates else None
        if p.rc == 0:
            summary["wall_ratio"] = summary["separate_wall_s"] / p.wall
        if pop_rate and seq_rates:
            summary["steady_ratio"] = pop_rate * len(pairs) / summary["separate_steps_per_s"]
        gaps = [r["loss_gap"] for r in ok if "loss_gap" in r]
        summary["max_final_loss_gap"] = max(gaps) if gaps else None
    res["summary"] = summary
    res["wall_s"] = round(time.time() - t_start, 1)
    write_json(path, res)

    if p.stopped:
        print(f"population STOPPED ({p.stopped}): its wall time is not a whole run's")
    print("\n| run | wall s | steady steps/s | last loss |\n|---|---|---|---|")
    print(f"| population of {len(pairs)} | {res['population']['wall_s']} | "
          f"{fmt(pop_rate, '.2f')} (x{len(pairs)} members = "
          f"{fmt(res['population']['member_steps_per_s'], '.1f')} member-steps/s) | - |")
    for r in res["separate"]:
        print(f"| train.py lr {r['lr']:g} seed {r['seed']} (rc {r['rc']}) | {r['wall_s']} | "
              f"{fmt(r['steps_per_s'], '.2f')} | {fmt(r['last_loss'])}"
              + (f" (member: {fmt(r['pop_last_loss'])})" if "pop_last_loss" in r else "")
              + " |")
    if k:
        ext = (f" (EXTRAPOLATED from {k} of {len(pairs)} runs: their mean wall x "
               f"{len(pairs)})" if summary["extrapolated"] else "")
        print(f"\n{len(pairs)} separate runs: {summary['separate_wall_s']:.1f}s{ext}; population"
              f" {p.wall:.1f}s: wall ratio {fmt(summary.get('wall_ratio'), '.2f')}x")
        print(f"steady state: population {fmt(pop_rate, '.2f')} steps/s x {len(pairs)} members"
              f" against {fmt(summary['separate_steps_per_s'], '.2f')} steps/s per separate "
              f"run: ratio {fmt(summary.get('steady_ratio'), '.2f')}x")
        print(f"final logged loss, member vs its separate run: max |diff| "
              f"{fmt(summary['max_final_loss_gap'], '.2e')}")
    if pop_rate:  # a guide for part mqar's --steps (same mixer, whole batch, alone)
        per_member = 1 / (pop_rate * len(pairs))
        n = 4 * 9 + 2 * 3  # part mqar's default members
        print(f"one member-step in the population: {per_member * 1e3:.2f} ms; part mqar's "
              f"{n} members at that cost: {n * per_member * 1e3:.0f} ms a step, "
              f"{2000 * n * per_member:.0f}s for 2,000 steps (if every mixer cost what "
              f"{a.speed_mixer} does and six processes shared the GPU without loss)")
    print(f"speed part: {res['wall_s']}s", flush=True)
    return res


# -------------------------------------------------------------------- part: performer
def perf_overrides(a, text: str) -> list[str]:
    o = {"model.mixer": "performer", "model.num_layers": a.perf_layers,
         "data.files": text, "logging.wandb": "disabled", "logging.progress": False,
         "train.eval_batches": a.perf_eval_batches, "train.checkpoint_every": 1000}
    if a.perf_steps:
        o["train.steps"] = a.perf_steps
    if a.impl != "auto":
        o["model.impl"] = a.impl
    if a.tiny:
        o.update({"model.d_model": 32, "model.num_heads": 2, "model.max_len": 32,
                  "model.num_random_features": 32, "data.seq_len": 32,
                  "train.batch_size": 4, "train.steps": a.perf_steps or 60,
                  "train.log_every": 5, "train.eval_every": 20, "train.eval_batches": 2,
                  "train.checkpoint_every": 20, "train.warmup_steps": 5})
    return [f"--config.{k}={v}" for k, v in o.items()] + extra(a)


def part_performer(a, out: pathlib.Path, work: pathlib.Path) -> dict:
    t_start = time.time()
    deadline = t_start + a.budget
    text = pathlib.Path(a.text)
    text = text if text.is_absolute() else ROOT / text
    if not text.is_file():
        raise SystemExit(f"--text={a.text}: no such file (the tiny-Shakespeare input.txt)")
    o = perf_overrides(a, str(text))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    root = fresh_dir(work / "performer")
    res = {"part": "performer", "gpu": gpu_info(), "overrides": o, "lr": a.perf_lr,
           "seeds": a.seeds, "budget_s": a.budget, "mode": "population", "runs": []}
    path = out / "performer.json"
    write_json(path, res)
    stop_at = deadline - a.perf_save_s
    procs, failed, dirs = [], False, []
    if a.perf_mode == "population":
        p = Proc("perf_population", [PY, "-m", "training.population",
                                     "--config=configs/shakespeare_char_gpu.py",
                                     f"--workdir={root / 'pop'}", f"--lrs={a.perf_lr}",
                                     f"--seeds={a.seeds}", *o], logs,
                     child_env(cache_dir=root / ".cache_pop"))
        procs = [p]
        run_to_end([p], stop_at, a.perf_save_s, f"budget: stopped at {stop_at - t_start:.0f}s")
        dirs = member_dirs(root / "pop")
        failed = p.rc not in (0, SIGTERM_RC) and p.step == 0 and deadline - time.time() > 90
        if failed:
            say("performer: the population failed; falling back to one train.py per seed")
            res["population_failed_tail"] = p.tail(1500)
    if a.perf_mode == "train.py" or failed:
        # One train.py process per seed, all at once: asked for, or the population failed
        # before its first logged step.
        res["mode"] = ("train.py per seed" if a.perf_mode == "train.py"
                       else "train.py per seed (population failed)")
        seeds = [int(s) for s in a.seeds.split(",")]
        procs = [Proc(f"perf_seed{s}", [PY, "train.py", "--config=configs/shakespeare_char_gpu.py",
                                        f"--workdir={root / f'seed{s}'}",
                                        f"--config.train.lr={a.perf_lr}",
                                        f"--config.train.seed={s}", *o], logs,
                      child_env(round(0.9 / len(seeds), 3)))
                 for s in seeds]
        run_to_end(procs, deadline - a.perf_save_s, a.perf_save_s, "budget")
        dirs = [root / f"seed{s}" for s in seeds]
    diverged = {}
    if (root / "pop" / "population.json").is_file():
        diverged = json.loads((root / "pop" / "population.json").read_text())["diverged"]
    for d in dirs:
        if not (d / "config.json").is_file():
            continue
        res["runs"].append(perf_record(d, diverged.get(d.name)))
    res["procs"] = [{"name": q.name, "rc": q.rc, "wall_s": round(q.wall, 1),
                     "stopped": q.stopped} for q in procs]
    res["wall_s"] = round(time.time() - t_start, 1)
    write_json(path, res)
    print_perf(res)
    return res


def perf_record(d: pathlib.Path, diverged_at) -> dict:
    c = json.loads((d / "config.json").read_text())
    entries = read_metrics(d)
    train = [e for e in entries if "loss" in e]
    evals = [e for e in entries if "eval_loss" in e]
    losses = np.array([as_float(e["loss"]) for e in train])
    gnorm = np.array([as_float(e.get("grad_norm", 0.0)) for e in train])
    non_finite = ([e["step"] for e in train if not math.isfinite(as_float(e["loss"]))
                   or not math.isfinite(as_float(e.get("grad_norm", 0.0)))]
                  + [e["step"] for e in evals if not math.isfinite(as_float(e["eval_loss"]))])
    # Rising training loss is divergence; a rising eval loss alone is overfitting (the
    # 8-layer runs overfit from ~step 500, docs/results.md).
    w = max(1, min(20, len(losses) // 5))
    smooth = (np.convolve(losses, np.ones(w) / w, mode="valid")
              if len(losses) >= w and np.all(np.isfinite(losses)) else losses)
    rise = float(smooth[-1] - smooth.min()) if len(smooth) else math.nan
    rec = {"run": d.name, "seed": int(c["train"]["seed"]), "lr": float(c["train"]["lr"]),
           "steps_planned": int(c["train"]["steps"]),
           "last_step": train[-1]["step"] if train else 0,
           "final_train_loss": float(losses[-1]) if len(losses) else None,
           "final_train_loss_smoothed": float(smooth[-1]) if len(smooth) else None,
           "min_train_loss_smoothed": float(smooth.min()) if len(smooth) else None,
           "train_loss_rise": rise, "smoothing_window_logs": w,
           "max_grad_norm": float(np.nanmax(gnorm)) if len(gnorm) else None,
           "final_eval_loss": as_float(evals[-1]["eval_loss"]) if evals else None,
           "final_eval_step": evals[-1]["step"] if evals else None,
           "best_eval_loss": min(as_float(e["eval_loss"]) for e in evals) if evals else None,
           "eval_curve": [(e["step"], as_float(e["eval_loss"])) for e in evals],
           "train_curve": [(e["step"], as_float(e["loss"]))
                           for e in train][::max(1, len(train) // 40)],
           "non_finite_steps": non_finite[:10], "diverged_at": diverged_at}
    rec["non_finite"] = bool(non_finite or diverged_at)
    rec["train_loss_rose"] = bool(math.isfinite(rise) and rise > 0.2)
    return rec


def print_perf(res) -> None:
    print(f"\nperformer, {res['mode']}:")
    print("| seed | steps done / planned | final train loss (smoothed) | min smoothed | "
          "final eval loss (step) | best eval loss | max grad norm | non-finite | "
          "train loss rose > 0.2 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["runs"]:
        print(f"| {r['seed']} | {r['last_step']} / {r['steps_planned']} | "
              f"{fmt(r['final_train_loss'])} ({fmt(r['final_train_loss_smoothed'])}) | "
              f"{fmt(r['min_train_loss_smoothed'])} | {fmt(r['final_eval_loss'])} "
              f"({r['final_eval_step']}) | {fmt(r['best_eval_loss'])} | "
              f"{fmt(r['max_grad_norm'], '.2f')} | {r['non_finite']} | "
              f"{r['train_loss_rose']} |")
    for r in res["runs"]:
        print(f"seed {r['seed']} eval curve: "
              + ", ".join(f"{s}: {v:.3f}" for s, v in r["eval_curve"]))
    for q in res["procs"]:
        print(f"{q['name']}: rc {q['rc']}, {q['wall_s']}s"
              + (f", stopped: {q['stopped']}" if q["stopped"] else ""))
    any_bad = any(r["non_finite"] or r["train_loss_rose"] for r in res["runs"])
    print(f"performer part: {res['wall_s']}s; "
          + ("SOME SEED DIVERGED OR WENT NON-FINITE" if any_bad
             else f"no seed non-finite or with a rising train loss over "
                  f"{min((r['last_step'] for r in res['runs']), default=0)} steps"),
          flush=True)


# ---------------------------------------------------------------------------------- CLI
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", required=True,
                    help="mqar, speed, performer, or several comma-separated")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/job_17_18"))
    ap.add_argument("--workroot", default="/tmp/job_17_18_runs",
                    help="checkpoints and member workdirs (deleted at each part's start)")
    ap.add_argument("--tiny", action="store_true", help="CPU check: tiny models and steps")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds for the part (0: mqar 480, speed 480, performer 300; "
                         "tiny: 300 each)")
    ap.add_argument("--seeds", default=None, help="0,1,2 (tiny mqar: 0,1)")
    # mqar
    ap.add_argument("--steps", type=int, default=0, help="mqar steps (0: 2000; tiny 30)")
    ap.add_argument("--lrs", default=None, help="1e-3,3e-3,1e-2 (tiny: 1e-3,1e-2)")
    ap.add_argument("--mixers", default=None, help=f"{PRIMARY} (tiny: linear,performer)")
    ap.add_argument("--refs", default=None,
                    help=f"reference mixers, {REFERENCE} ('' for none; tiny: softmax)")
    ap.add_argument("--ref_lrs", default=None,
                    help="the references' lrs (3e-3: where both learned MQAR (256, 16) at "
                         "d128 in docs/results.md; tiny: the --lrs)")
    ap.add_argument("--no_refs_yield", dest="refs_yield", action="store_false",
                    help="never stop a reference population to make room for the primaries")
    ap.add_argument("--parallel", type=int, default=0,
                    help="processes at once (0: every population; tiny: 3)")
    ap.add_argument("--mem_fraction", type=float, default=0,
                    help="XLA_PYTHON_CLIENT_MEM_FRACTION per process (0: 0.9 / processes)")
    ap.add_argument("--grad_accum", type=int, default=2,
                    help="mqar microbatches a step (the gradient of the whole batch; 2 "
                         "halves the activation memory so six populations fit)")
    ap.add_argument("--impl", default="auto", help="model.impl (chunk: no Pallas kernels)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every training process of the part, e.g. "
                         "--set=train.b2=0.95 (repeatable)")
    ap.add_argument("--eval_examples", type=int, default=0, help="0: 1024 (tiny 64)")
    ap.add_argument("--eval_reserve", type=float, default=0,
                    help="seconds kept for evaluation after training (0: 70; tiny 60)")
    ap.add_argument("--min_launch_s", type=float, default=0,
                    help="start no population with less training time left (0: 150; "
                         "tiny 30)")
    # speed
    ap.add_argument("--speed_steps", type=int, default=0, help="0: 300 (tiny 20)")
    ap.add_argument("--speed_lrs", default=None,
                    help=f"{ZOOLOGY_LRS} (tiny: 1e-3,1e-2 with seeds 0,1)")
    ap.add_argument("--speed_mixer", default="linear")
    # performer
    ap.add_argument("--text", default=".jobs/input.txt", help="tiny-Shakespeare input.txt")
    ap.add_argument("--perf_layers", type=int, default=8)
    ap.add_argument("--perf_lr", default="1e-3", help="configs/shakespeare_char_gpu.py's lr")
    ap.add_argument("--perf_steps", type=int, default=0,
                    help="train.steps (0: the config's 5,000; the budget stops it earlier)")
    ap.add_argument("--perf_eval_batches", type=int, default=50,
                    help="train.eval_batches (compare_shakespeare.py's 50 x 64 x 256)")
    ap.add_argument("--perf_mode", default="population", choices=["population", "train.py"],
                    help="the seeds as one training.population, or one train.py each")
    ap.add_argument("--perf_save_s", type=float, default=25,
                    help="seconds before the budget's end to send SIGTERM (save and exit)")
    # worker
    ap.add_argument("--rundir", help=argparse.SUPPRESS)
    ap.add_argument("--eval_json", help=argparse.SUPPRESS)
    ap.add_argument("--eval_batch", type=int, default=128, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.part == "_eval":
        return worker_eval(a)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(a.workroot)
    parts = [p for p in a.part.split(",") if p]
    unknown = set(parts) - {"mqar", "speed", "performer"}
    if unknown:
        ap.error(f"unknown --part {sorted(unknown)}: choose mqar, speed, performer")
    budget_flag, seeds_flag, lrs_flag, speed_lrs_flag = a.budget, a.seeds, a.lrs, a.speed_lrs
    mixers_flag, refs_flag, ref_lrs_flag = a.mixers, a.refs, a.ref_lrs
    for part in parts:
        a.budget = budget_flag or (300 if a.tiny else
                                   {"mqar": 480, "speed": 480, "performer": 300}[part])
        a.seeds = seeds_flag or ("0,1" if a.tiny and part != "performer" else "0,1,2")
        a.speed_lrs = speed_lrs_flag or ("1e-3,1e-2" if a.tiny else ZOOLOGY_LRS)
        a.lrs = lrs_flag or ("1e-3,1e-2" if a.tiny else "1e-3,3e-3,1e-2")
        if part == "mqar":
            a.mixers = mixers_flag if mixers_flag is not None else (
                "linear,performer" if a.tiny else PRIMARY)
            a.refs = refs_flag if refs_flag is not None else (
                "softmax" if a.tiny else REFERENCE)
            a.ref_lrs = ref_lrs_flag or (a.lrs if a.tiny else "3e-3")
            a.parallel = a.parallel or (3 if a.tiny else 0)
            a.eval_reserve = a.eval_reserve or (60 if a.tiny else 70)
            a.min_launch_s = a.min_launch_s or (30 if a.tiny else 150)
        say(f"part {part}: budget {a.budget:.0f}s; out {out}; python {sys.version.split()[0]}")
        {"mqar": part_mqar, "speed": part_speed, "performer": part_performer}[part](
            a, out, work)


if __name__ == "__main__":
    main()
