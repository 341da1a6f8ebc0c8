"""First-step compile time of train.py's train step, unrolled against scanned layers.

    python scripts/bench_compile.py [--mixers gated_deltanet,softmax] [--layers 8,24]
        [--d_model 256] [--seq_len 256] [--batch 8] [--repeats 2] [--out FILE.json]

Each row is one fresh process (nothing cached between rows): it builds the model of
configs/mqar.py with the given sizes, model.scan_layers and train.precision's compute
dtype (bfloat16 on GPU, as train.py), initialises it as train.py
does (training.runtime.describe_model / init_fresh / compile_steps) and times
`train_step.lower(...)` and `.compile()` on a real-shaped batch; the first step of a run
spends about their sum before it computes. Also the process CPU time over both (cpu_s),
which a shared machine disturbs less than wall time. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def one(mixer: str, layers: int, scan: bool, d_model: int, seq_len: int,
        batch: int, heads: int = 0, precision: str = "auto") -> dict:
    import jax
    import numpy as np

    from models import ModelConfig
    from training import config_tools, runtime, step
    from training import sharding as shd

    start = time.perf_counter()

    def phase(name):  # on stderr, so a row cut by a time limit shows where it was
        print(f"[{time.perf_counter() - start:7.1f} s] {name}", file=sys.stderr, flush=True)

    config = config_tools.load_config_file("configs/mqar.py")
    config_tools.set_values(config, {"train.batch_size": batch, "data.seq_len": seq_len})
    model_cfg = ModelConfig(vocab_size=256, d_model=d_model, num_layers=layers,
                            num_heads=heads or max(1, d_model // 64), mixer=mixer,
                            max_len=seq_len, scan_layers=scan,
                            dtype=config_tools.compute_dtype(precision))
    mesh = runtime.make_mesh(config)
    phase("describe")
    model, layout = runtime.describe_model(config, model_cfg, mesh)
    phase("init")
    params, opt_state, rest = runtime.init_fresh(model, layout)
    jax.block_until_ready(params)
    phase("lower")
    steps = runtime.compile_steps(model, rest, layout, config.train, mesh, step.Rows())
    zeros = np.zeros((batch, seq_len), np.int32)
    host = {"inputs": zeros, "targets": zeros, "segment_ids": zeros,
            "mask": np.ones((batch, seq_len), np.float32)}
    data = shd.global_batch(host, layout.batch)
    c0, t0 = time.process_time(), time.perf_counter()
    lowered = steps.train.lower(params, opt_state, data, *steps.keys(0))
    t1 = time.perf_counter()
    phase("compile")
    lowered.compile()
    phase("done")
    c2, t2 = time.process_time(), time.perf_counter()
    return {"cpu_s": c2 - c0, "mixer": mixer, "layers": layers, "scan_layers": scan, "d_model": d_model,
            "seq_len": seq_len, "batch": batch, "lower_s": t1 - t0, "compile_s": t2 - t1,
            "total_s": t2 - t0, "platform": jax.devices()[0].platform,
            "dtype": model_cfg.dtype}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mixers", default="gated_deltanet,softmax")
    p.add_argument("--layers", default="8,24")
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=0, help="0: d_model // 64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precision", default="auto",
                   help="as train.precision: auto = bfloat16 on GPU, float32 on CPU")
    p.add_argument("--out", default="")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # mixer,layers,scan
    a = p.parse_args()
    if a.one:
        mixer, layers, scan = a.one.split(",")
        print(json.dumps(one(mixer, int(layers), scan == "1", a.d_model, a.seq_len,
                             a.batch, a.heads, a.precision)))
        return
    rows = []
    for mixer in a.mixers.split(","):
        for layers in map(int, a.layers.split(",")):
            for scan in (False, True):
                runs = []
                for _ in range(a.repeats):
                    out = subprocess.run(
                        [sys.executable, __file__, f"--one={mixer},{layers},{int(scan)}",
                         f"--d_model={a.d_model}", f"--seq_len={a.seq_len}",
                         f"--batch={a.batch}", f"--heads={a.heads}",
                         f"--precision={a.precision}"],
                        capture_output=True, text=True, check=True)
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                row = dict(runs[0], runs=[r["total_s"] for r in runs],
                           cpu_runs=[r["cpu_s"] for r in runs],
                           median_s=statistics.median(r["total_s"] for r in runs))
                rows.append(row)
                print(f"{mixer:15s} {layers:3d} layers  scan_layers={scan!s:5s}  "
                      f"lower+compile {', '.join(f'{r:.1f}' for r in row['runs'])} s "
                      f"(CPU {', '.join(f'{r:.1f}' for r in row['cpu_runs'])} s)",
                      flush=True)
                if a.out:
                    with open(a.out, "w") as f:
                        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
