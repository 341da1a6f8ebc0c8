"""Process CPU time of one train.py step of a config, with XLA on one thread, so the figure
is the work a step does whatever else runs on the machine (wall-clock timings on a shared
2-core machine swing 2x).

    python scripts/cpu_step_work.py [--config configs/mqar.py] [--steps 20] \\
        model.mixer=gated_deltanet [model.chunk_size=32 ...]

    python scripts/cpu_step_work.py --variant "model.mixer=softmax" \\
        --variant "model.mixer=gated_deltanet" [--rounds 8]

Prints CPU milliseconds per step (the mean over --steps calls after 3 warm-up calls) and
the CPU seconds of compiling the step; with --profile N, also the N op kinds (XLA thunks,
named by their HLO instruction less its number) that took the most time a step, from a
jax.profiler trace of the timed steps. The step is eval.speed's, i.e. the one train.py
runs (training.step.make_train_step, with the config's mesh, optimizer and precision), on
the config's own batches. With --variant (repeated), the override sets are compiled in one
process and timed round-robin, --rounds times: their medians compare within a few percent,
where the same config in separate processes differs by up to 20%.

--wall times wall-clock milliseconds with XLA's own threads instead (what train.py runs
with): on a 2-core machine a step's ops then run two at a time, so what lies on its
critical path counts more than its share of the work; the round-robin order keeps the
comparison fair.
"""
from __future__ import annotations

import os
import sys

# Read before jax is imported: XLA takes its threads from the flags at start.
WALL = "--wall" in sys.argv[1:]
if not WALL:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false"
                               + " intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import tqdm  # noqa: E402

from eval import speed  # noqa: E402
from training import builders, config_tools, host_memory  # noqa: E402
from training import sharding as shd  # noqa: E402


def print_top_ops(trace_dir: pathlib.Path, steps: int, top: int) -> None:
    """The trace's complete events summed by name (numbers stripped: fusion.12 and
    fusion.40 are one kind), ms a step, largest first."""
    path = next(trace_dir.rglob("*.trace.json.gz"))
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    total_us, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name = re.sub(r"[._]\d+$", "", e.get("name", ""))
        total_us[name] += e["dur"]
        count[name] += 1
    for name, us in total_us.most_common(top):
        print(f"{us / steps / 1e3:8.2f} ms {count[name] / steps:7.1f}x  {name}")


class CompiledStep:
    """A config's compiled train step on its first batch, run `steps` times per call on
    the parameters it last returned (the time of a call by `clock` is the measurement)."""

    def __init__(self, config, clock=time.process_time):
        self.clock = clock
        dataset = builders.build_dataset(config)
        steps, params, opt_state, batch_sh = speed.jitted_train_step(config, dataset)
        self.data = shd.global_batch(dataset.batch(0, config.train.batch_size), batch_sh)
        self.key = steps.keys(0)
        t0 = clock()
        self.compiled = steps.train.lower(params, opt_state, self.data, *self.key).compile()
        self.compile_s = clock() - t0
        self.state = (params, opt_state)
        self.metrics = None
        self(3)  # warm-up

    def __call__(self, steps: int) -> float:
        """Runs `steps` steps; returns their milliseconds a step by self.clock."""
        params, opt_state = self.state
        t0 = self.clock()
        for _ in range(steps):
            params, opt_state, self.metrics = self.compiled(params, opt_state, self.data,
                                                            *self.key)
        jax.block_until_ready(self.metrics)
        self.state = (params, opt_state)
        return (self.clock() - t0) / steps * 1e3


def compare(config_path: str, variants: list[str], steps: int, rounds: int,
            clock=time.process_time, unit: str = "CPU") -> None:
    """Round-robin: every variant's `steps` steps in turn, `rounds` times, in this one
    process, so a slow spell of the machine (CPU time swings ~20% between processes on a
    shared 2-core machine) falls on all of them alike; prints the median and range."""
    runs = {v: CompiledStep(config_tools.config_with_overrides(config_path, v.split()), clock)
            for v in variants}
    times = {v: [] for v in variants}
    for _ in tqdm.trange(rounds, desc="rounds"):
        for v in variants:
            times[v].append(runs[v](steps))
    base = statistics.median(times[variants[0]])
    for v in variants:
        ms = statistics.median(times[v])
        print(f"{ms:7.1f} {unit} ms/step ({ms / base:.2f}x; range {min(times[v]):.1f}-"
              f"{max(times[v]):.1f}), compile {runs[v].compile_s:.1f} {unit} s  "
              f"{v or 'defaults'}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/mqar.py")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0,
                    help="also print the N op kinds taking the most time a step")
    ap.add_argument("--variant", action="append", default=[],
                    help="a set of space-separated KEY=VALUE overrides; repeated: compare "
                         "them round-robin in this process (the first is the base)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of --variant comparison")
    ap.add_argument("--wall", action="store_true",
                    help="wall-clock time with XLA's own threads (module docstring)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE, as train.py's --config.KEY")
    args = ap.parse_args(argv)
    if args.wall != WALL:  # main(argv) called with other arguments than the process's
        ap.error("--wall decides XLA's threads at import: give it on the command line")
    clock, unit = (time.perf_counter, "wall") if WALL else (time.process_time, "CPU")
    host_memory.keep_freed_memory()  # as train.py does
    if args.variant:
        if args.overrides or args.profile:
            ap.error("--variant compares whole override sets: give no other overrides "
                     "or --profile")
        compare(args.config, args.variant, args.steps, args.rounds, clock, unit)
        return
    run = CompiledStep(config_tools.config_with_overrides(args.config, args.overrides), clock)
    with tempfile.TemporaryDirectory() as trace_dir:
        tracing = (jax.profiler.trace(trace_dir, create_perfetto_trace=True)
                   if args.profile else contextlib.nullcontext())
        with tracing:
            ms = run(args.steps)
        if args.profile:
            print_top_ops(pathlib.Path(trace_dir), args.steps, args.profile)
    print(f"{' '.join(args.overrides) or 'defaults'}: {ms:.1f} {unit} ms/step, compile "
          f"{run.compile_s:.1f} {unit} s, loss {float(run.metrics['loss']):.4f}")


if __name__ == "__main__":
    main()
