"""Process CPU time of one train.py step of a config, with XLA on one thread, so the figure
is the work a step does whatever else runs on the machine (wall-clock timings on a shared
2-core machine swing 2x).

    python scripts/cpu_step_work.py [--config configs/mqar.py] [--steps 20] \\
        model.mixer=gated_deltanet [model.chunk_size=32 ...]

Prints CPU milliseconds per step (the mean over --steps calls after 3 warm-up calls) and
the CPU seconds of compiling the step; with --profile N, also the N op kinds (XLA thunks,
named by their HLO instruction less its number) that took the most time a step, from a
jax.profiler trace of the timed steps. The step is eval.speed's, i.e. the one
train.py runs (training.step.make_train_step, with the config's mesh, optimizer and
precision), on the config's own batches.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_multi_thread_eigen=false"
                           + " intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from eval import speed  # noqa: E402
from training import builders, config_tools, host_memory  # noqa: E402
from training import sharding as shd  # noqa: E402


def load_config(path: str):
    spec = importlib.util.spec_from_file_location("cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/mqar.py")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0,
                    help="also print the N op kinds taking the most time a step")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE, as train.py's --config.KEY")
    args = ap.parse_args(argv)
    host_memory.keep_freed_memory()  # as train.py does
    config = load_config(args.config)
    for item in args.overrides:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        old = config[section][name]
        config[section][name] = (value == "True") if isinstance(old, bool) else type(old)(value)
    config_tools.check_config(config)
    batch, seq_len = config.train.batch_size, config.data.seq_len
    dataset = builders.build_dataset(config)
    steps, params, opt_state, batch_sh = speed.jitted_train_step(config, dataset)
    step = steps.train
    data = shd.global_batch(dataset.batch(0, batch), batch_sh)
    key = (steps.key(0), steps.feature_key(0))
    t0 = time.process_time()
    compiled = step.lower(params, opt_state, data, *key).compile()
    compile_s = time.process_time() - t0
    for _ in range(3):
        params, opt_state, metrics = compiled(params, opt_state, data, *key)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        tracing = (jax.profiler.trace(trace_dir, create_perfetto_trace=True)
                   if args.profile else contextlib.nullcontext())
        with tracing:
            t0 = time.process_time()
            for _ in range(args.steps):
                params, opt_state, metrics = compiled(params, opt_state, data, *key)
            jax.block_until_ready(metrics)
            ms = (time.process_time() - t0) / args.steps * 1e3
        if args.profile:
            print_top_ops(pathlib.Path(trace_dir), args.steps, args.profile)
    print(f"{' '.join(args.overrides) or 'defaults'}: {ms:.1f} CPU ms/step, compile "
          f"{compile_s:.1f} CPU s, loss {float(metrics['loss']):.4f}")


if __name__ == "__main__":
    main()
