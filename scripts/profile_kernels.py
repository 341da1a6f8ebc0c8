"""Where the time of one GDN / linear-attention call goes, kernel by kernel.

    python scripts/profile_kernels.py [--out DIR] [--shapes 2x8192] [--what gdn-fwdbwd,...]
    python scripts/profile_kernels.py --tune [--out DIR]
    python scripts/profile_kernels.py --tune-seq [--settings seq|prep] [--fla] [--out DIR]
    python scripts/profile_kernels.py --fla [--shapes ...]    # fla's forward, its own process

Runs each case a few times under `jax.profiler.trace` (with a Perfetto trace), then sums
the device events by kernel name and prints the top ones per case (ms per call, share of
the call). Writes DIR/profile.json. --tune instead times the kernels' tunables side by
side in this one process (decode block/warps, the preparation's warps, the narrowest
value block of the sequential loop) and writes DIR/tune.json; --tune-seq times a list of
settings of the GPU programs one change at a time (tune_settings) and writes the fastest
as DIR/best_seq.env; --fla profiles fla's chunk_gated_delta_rule forward kernel by kernel
(torch.profiler, so in a process of its own). A diagnostic for kernel
work, not a benchmark: the timings of record come from scripts/bench_kernels.py.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import scripts.bench_kernels as bk  # noqa: E402

REPS = 5


def split_gdn():
    """The Pallas GDN with the other setting of recurrence.SPLIT_FWD."""
    from kernels.pallas import recurrence
    return bk.with_setting(bk.gdn_fn("pallas"), recurrence, "SPLIT_FWD",
                           "always" if recurrence.SPLIT_FWD == "never" else "never")


def prep_gdn(n):
    """The Pallas GDN with the preparation as n kernels (intra.PREP_KERNELS)."""
    from kernels.pallas import intra
    return bk.with_setting(bk.gdn_fn("pallas"), intra, "PREP_KERNELS", n)


def cases(b, t, what):
    from kernels.pallas import intra
    key = jax.random.PRNGKey(b * t)
    q, k, v, g, beta = bk.gdn_inputs(key, b, t)
    do = jax.random.normal(jax.random.fold_in(key, 2), v.shape, jnp.float32).astype(v.dtype)
    table = {
        "gdn-fwd": lambda: (jax.jit(bk.gdn_fn("pallas")), (q, k, v, g, beta)),
        "gdn-fwdbwd": lambda: (bk.fwd_bwd(bk.gdn_fn("pallas"), 5), (q, k, v, g, beta, do)),
        "gdn-fwdbwd-xbwd": lambda: (bk.fwd_bwd(bk.gdn_fn("pallas"), 5, "xla"),
                                    (q, k, v, g, beta, do)),
        "linear-fwdbwd": lambda: (bk.fwd_bwd(bk.la_fn("pallas"), 3), (q, k, v, do)),
        # the forward as one loop under a gradient too, or split without one (the default
        # splits it into a state pass + an output pass under a gradient only)
        "gdn-fwd-split": lambda: (jax.jit(split_gdn()), (q, k, v, g, beta)),
        "gdn-fwdbwd-split": lambda: (bk.fwd_bwd(split_gdn(), 5), (q, k, v, g, beta, do)),
        # the preparation as n kernels (intra.PREP_KERNELS, whatever the default)
        **{f"gdn-fwd-prep{n}": (lambda n=n: (jax.jit(prep_gdn(n)), (q, k, v, g, beta)))
           for n in intra.PREP_KERNELS_CHOICES},
        **{f"gdn-fwdbwd-prep{n}": (lambda n=n: (bk.fwd_bwd(prep_gdn(n), 5),
                                                (q, k, v, g, beta, do))) for n in intra.PREP_KERNELS_CHOICES},
    }
    for name in what:
        yield name, *table[name]()


def device_events(trace_dir):
    """(name, dur_us) of every complete event on a device (GPU/TPU) process."""
    files = sorted(pathlib.Path(trace_dir).rglob("*.trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no perfetto trace under {trace_dir}")
    with gzip.open(files[-1], "rt") as fh:
        data = json.load(fh)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    dev = {pid for pid, n in names.items() if "GPU" in n or "TPU" in n or "gpu" in n}
    return [(e["name"], float(e.get("dur", 0))) for e in events
            if e.get("ph") == "X" and e.get("pid") in dev], sorted(set(names.values()))


def profile(fn, args):
    jax.block_until_ready(fn(*args))      # compile outside the trace
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(REPS):
                out = fn(*args)
            jax.block_until_ready(out)
        events, procs = device_events(d)
    per = collections.defaultdict(float)
    for name, dur in events:
        per[name] += dur / REPS / 1e3       # ms per call
    return dict(sorted(per.items(), key=lambda kv: -kv[1])), procs


def profile_fla(shapes, top):
    """fla's chunk_gated_delta_rule forward, kernel by kernel (torch.profiler's CUDA
    times, ms per call), at each (b, t): where the anchor spends its time, for comparison
    with ours. Returns {case: {"total_ms", "kernels_ms"}} (empty without torch + fla)."""
    torch, fops = bk.fla_module()
    if fops is None:
        return {}
    from torch.profiler import ProfilerActivity, profile as tprofile
    results = {}
    for b, t in shapes:
        q, k, v, g, beta = bk.fla_gdn_inputs(torch, b, t)
        with torch.no_grad():
            for _ in range(3):   # warm-up (Triton autotuning, compilation)
                fops.chunk_gated_delta_rule(q, k, v, g, beta)
            torch.cuda.synchronize()
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(REPS):
                    fops.chunk_gated_delta_rule(q, k, v, g, beta)
                torch.cuda.synchronize()
        per = collections.defaultdict(float)
        for avg in prof.key_averages():   # kernels are the CUDA-side entries
            if getattr(avg.device_type, "name", "") == "CUDA":
                us = getattr(avg, "self_device_time_total", None)
                us = avg.self_cuda_time_total if us is None else us
                per[avg.key] += us / REPS / 1e3            # us -> ms per call
        per = dict(sorted(per.items(), key=lambda kv: -kv[1]))
        total = sum(per.values())
        results[f"fla-gdn-fwd {b}x{t}"] = {"total_ms": total, "kernels_ms": per}
        print(f"\n## fla chunk_gated_delta_rule fwd B{b} T{t}: {total:.3f} ms of CUDA "
              f"kernel time per call ({len(per)} kernels)")
        for name, ms in list(per.items())[:top]:
            print(f"  {ms:8.3f} ms {100 * ms / max(total, 1e-9):5.1f}%  {name[:110]}")
        sys.stdout.flush()
    return results


def time_gdn_fwd(b, t):
    """Seconds of the Pallas GDN forward at (b, t) (the benchmark's inputs and timer)."""
    xs = bk.gdn_inputs(jax.random.PRNGKey(b * t), b, t)
    return bk.time_jax(jax.jit(bk.gdn_fn("pallas")), *xs)


def time_gdn_fwdbwd(b, t):
    """Seconds of the Pallas GDN forward + backward at (b, t)."""
    xs = bk.gdn_inputs(jax.random.PRNGKey(b * t), b, t)
    return bk.time_jax(bk.fwd_bwd(bk.gdn_fn("pallas"), 5), *xs, jnp.ones_like(xs[2]))


def tune(out):
    """Tunables timed side by side (bench_kernels.time_jax); a row per setting."""
    from kernels.pallas import decode, intra, recurrence
    rows = []

    def row(what, setting, seconds):
        rows.append({"what": what, "setting": setting, "ms": seconds * 1e3})
        print(f"  {what:28s} {setting:28s} {seconds * 1e3:8.3f} ms", flush=True)
        if out:
            pathlib.Path(out).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(out) / "tune.json").write_text(json.dumps(rows, indent=1))

    def attempt(what, setting, fn):
        try:
            row(what, setting, fn())
        except Exception as e:  # noqa: BLE001
            print(f"  {what:28s} {setting:28s} FAILED {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200]}", flush=True)

    # decode step, B64 H16 D128 (the benchmark's inputs)
    qd, kd, vd, gd, bd, sd = bk.decode_inputs()
    for bv in (32, 64, 128):
        for warps in (2, 4, 8):
            state = {"s": jnp.array(sd)}

            def call(bv=bv, warps=warps):
                o, state["s"] = decode.gated_delta_step_pallas(
                    qd, kd, vd, gd, bd, state["s"], block_v=bv, num_warps=warps)
                return o
            attempt("decode B64", f"block_v={bv} warps={warps}", lambda: bk.time_jax(call))
    torch, fops = bk.fla_module()
    if fops is not None:
        for i in range(2):
            attempt("decode B64", f"fla fused recurrent #{i}",
                    lambda: bk.fla_decode(torch, fops))

    saved = intra.NUM_WARPS, recurrence.MIN_BLOCK_V
    for warps in (4, 8):
        intra.NUM_WARPS = warps
        for b, t in ((8, 2048), (2, 8192)):
            attempt(f"gdn fwd B{b} T{t}", f"prep warps={warps}", lambda: time_gdn_fwd(b, t))
    intra.NUM_WARPS = saved[0]
    for minbv in (32, 16):
        recurrence.MIN_BLOCK_V = minbv
        attempt("gdn fwd B1 T32768", f"min block_v={minbv}", lambda: time_gdn_fwd(1, 32768))
        attempt("gdn fwd+bwd B1 T32768", f"min block_v={minbv}",
                lambda: time_gdn_fwdbwd(1, 32768))
        attempt("gdn fwd+bwd B2 T8192", f"min block_v={minbv}",
                lambda: time_gdn_fwdbwd(2, 8192))
    recurrence.MIN_BLOCK_V = saved[1]
    return rows


# The settings tune_sequential varies: bench_kernels' knobs (key -> module, attribute,
# environment variable), the ones every benchmark run records.
SEQ_KNOBS = bk.KNOBS


def env_value(value):
    """A setting as its environment variable reads it (booleans as 1 / 0)."""
    return int(value) if isinstance(value, bool) else value


def tune_settings(name, default):
    """The settings a --tune-seq run compares (name: --settings), each one change from
    the defaults, and the cases it times them on."""
    if name == "prep":   # the triangular solve of the preparation, in the forward
        # (session 6: the two-kernel form at 1 warp with TF32 products won, now the
        # default; rows, more warps and three kernels were slower) each against it
        return ([default, {**default, "prep_kernels": 3},
                 {**default, "solve_precision": "highest"},
                 {**default, "diag_inverse": "rows"}, {**default, "kkt_solve_warps": 2}],
                (("fwd B8 T2048", time_gdn_fwd, 8, 2048),
                 ("fwd B2 T8192", time_gdn_fwd, 2, 8192),
                 ("fwd B1 T32768", time_gdn_fwd, 1, 32768)))
    # the shapes with targets: GDN fwd at all three, fwd+bwd at T8192 and T32768 only
    targets = (("fwd B8 T2048", time_gdn_fwd, 8, 2048),
               ("fwd+bwd B2 T8192", time_gdn_fwdbwd, 2, 8192),
               ("fwd B1 T32768", time_gdn_fwd, 1, 32768),
               ("fwd+bwd B1 T32768", time_gdn_fwdbwd, 1, 32768))
    if name == "warps":  # the untuned warps: the W/Ut(/P) kernel's, the sequential loops'
        # (session 6: W/Ut at 8 warps won, now the default; 2, and the loops at 8, slower)
        return [default, {**default, "wu_warps": 4}, {**default, "seq_warps": 8}], targets
    # (chunk 128 ran out of shared memory at 3 stages everywhere and at 2 stages at
    # B8 T2048 in session 5, call 2, and the two-kernel preparation is in "prep"; neither
    # is repeated here). seq_programs 64: V blocks twice as wide in the sequential loops,
    # half the programs, for the long single-sequence case.
    return ([default, {**default, "prep_bwd_warps": 8}, {**default, "output_warps": 8},
             {**default, "seq_stages": 2}, {**default, "seq_programs": 64}], targets)


def fla_anchor_rows(cases_):
    """fla's chunk_gated_delta_rule forward at the cases' forward shapes, timed in this
    process (bench_kernels' inputs and timer): {case: ms}."""
    torch, fops = bk.fla_module()
    if fops is None:
        return {}
    return {name: bk.fla_rows(torch, fops, b, t)["gdn"] * 1e3
            for name, timer, b, t in cases_ if timer is time_gdn_fwd}


def tune_sequential(out, which="seq", fla=False):
    """Settings of the GPU kernels of the GDN op (SEQ_KNOBS: warps and stages of the
    sequential loops, the gradient, output, preparation and solve kernels' warps, the
    split forward, the diagonal-block inverse, ...), one change at a time from the current
    defaults (tune_settings(which): the settings and the cases), each timed side by side
    (a setting that fails on one shape, e.g. out of shared memory, counts as infinitely
    slow); fla: fla's forward too, at the forward cases' shapes. Writes
    DIR/seq.json and DIR/best_seq.env (the setting with the least summed time, as the
    environment variables that select it) so a job can benchmark with it."""
    knob = bk.knob
    default = {key: getattr(*knob(key)) for key in SEQ_KNOBS}  # restored at the end
    settings, cases_ = tune_settings(which, default)
    total = lambda r: sum(r[name] for name, *_ in cases_)  # noqa: E731
    rows, anchor = [], []

    def write():  # after every row, so a job cut short by its timeout keeps what it timed
        if not out:
            return
        d = pathlib.Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "seq.json").write_text(json.dumps(anchor + rows, indent=1))
        if rows:
            best_ = min(rows, key=total)
            (d / "best_seq.env").write_text(
                "export " + " ".join(f"{env}={env_value(best_[key])}"
                                     for key, (_, _, env) in SEQ_KNOBS.items()) + "\n")

    if fla:  # the anchor, side by side, first (a timeout then cuts settings, not it)
        times = fla_anchor_rows(cases_)
        anchor.append({"impl": "fla", **times})
        print("  fla: " + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()), flush=True)
        write()
    for st in settings:
        for key in SEQ_KNOBS:
            setattr(*knob(key), st[key])
        times = {}
        for name, timer, b, t in cases_:
            try:
                times[name] = timer(b, t)
            except Exception as e:  # noqa: BLE001
                print(f"  seq {st} {name}: FAILED {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}", flush=True)
                times[name] = float("inf")
        rows.append({**st, **{k: v * 1e3 for k, v in times.items()}})
        print(f"  seq {st}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in times.items()),
              flush=True)
        write()
    for key in SEQ_KNOBS:
        setattr(*knob(key), default[key])
    best = min(rows, key=total)
    print(f"  best: {best}", flush=True)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="8x2048,2x8192,1x32768")
    ap.add_argument("--what", default="gdn-fwd,gdn-fwdbwd,gdn-fwdbwd-xbwd,linear-fwdbwd")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--tune", action="store_true", help="time the tunables instead")
    ap.add_argument("--settings", default="seq", choices=("seq", "prep", "warps"),
                    help="which settings --tune-seq compares (tune_settings)")
    ap.add_argument("--fla", action="store_true",
                    help="profile fla's chunk_gated_delta_rule forward instead "
                         "(torch.profiler; in its own process: it holds CUPTI); with "
                         "--tune-seq, time it beside the settings")
    ap.add_argument("--tune-seq", action="store_true",
                    help="time the sequential and gradient kernels' settings instead")
    args = ap.parse_args()
    if args.tune:
        tune(args.out)
        return
    if args.tune_seq:
        tune_sequential(args.out, args.settings, args.fla)
        return
    if args.fla:  # alone: torch's profiler holds CUPTI, so a JAX trace after it is empty
        shapes = [tuple(int(x) for x in spec.split("x")) for spec in args.shapes.split(",")]
        results = profile_fla(shapes, args.top)
        if args.out:
            pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(args.out) / "profile_fla.json").write_text(
                json.dumps(results, indent=1))
        return
    results = {}
    for spec in args.shapes.split(","):
        b, t = (int(x) for x in spec.split("x"))
        for name, fn, xs in cases(b, t, args.what.split(",")):
            try:
                per, procs = profile(fn, xs)
            except Exception as e:  # noqa: BLE001  (one case must not stop the job)
                print(f"# FAILED {name} {spec}: {type(e).__name__}: {e}", flush=True)
                continue
            total = sum(per.values())
            results[f"{name} {spec}"] = {"total_ms": total, "kernels_ms": per}
            print(f"\n## {name} B{b} T{t}: {total:.3f} ms of device events per call "
                  f"({len(per)} kernels; processes {procs})")
            for kname, ms in list(per.items())[:args.top]:
                print(f"  {ms:8.3f} ms {100 * ms / max(total, 1e-9):5.1f}%  {kname[:110]}")
            sys.stdout.flush()
            if args.out:
                pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
                (pathlib.Path(args.out) / "profile.json").write_text(
                    json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
