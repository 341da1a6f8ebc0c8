"""Where the time of one GDN / linear-attention call goes, kernel by kernel.

    python scripts/profile_kernels.py [--out DIR] [--shapes 2x8192] [--what gdn-fwdbwd,...]
        [--tuning key=value,...]
    python scripts/profile_kernels.py --tune [--out DIR]
    python scripts/profile_kernels.py --tune-seq [--settings seq|prep|warps] [--fla]
        [--tuning key=value,...] [--out DIR]
    python scripts/profile_kernels.py --fla [--shapes ...]   # fla's forward, own process

Runs each case a few times under `jax.profiler.trace` (with a Perfetto trace), then sums
the device events by kernel name and prints the top ones per case (ms per call, share of
the call). Writes DIR/profile.json. The Pallas ops run at one kernels.pallas.Tuning:
DEFAULT_TUNING with the fields --tuning names replaced (bench_kernels.parse_tuning).
--tune instead times settings side by side in this one process (the decode step's block
and warps, the narrowest value block of the sequential loops) and writes DIR/tune.json;
--tune-seq times a list of Tunings, each one field changed from --tuning's
(tune_settings), and writes the fastest as a --tuning string, DIR/best_seq.tuning (every
field, so it selects the same Tuning whatever the defaults are then):

    python scripts/bench_kernels.py --tuning "$(cat DIR/best_seq.tuning)"

--fla profiles fla's chunk_gated_delta_rule forward kernel by kernel (torch.profiler, so
in a process of its own). A diagnostic for kernel work, not a benchmark: the timings of
record come from scripts/bench_kernels.py.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import scripts.bench_kernels as bk  # noqa: E402
from kernels.pallas import DEFAULT_TUNING  # noqa: E402

REPS = 5
CASES = ("gdn-fwd", "gdn-fwdbwd", "linear-fwdbwd")


def cases(b, t, what, tuning=DEFAULT_TUNING):
    """(name, jitted function, arguments) of each case named in what, at tuning."""
    key = jax.random.PRNGKey(b * t)
    q, k, v, g, beta = bk.gdn_inputs(key, b, t)
    do = jax.random.normal(jax.random.fold_in(key, 2), v.shape, jnp.float32).astype(v.dtype)
    gdn, linear = bk.gdn_fn("pallas", tuning), bk.la_fn("pallas", tuning)
    table = {
        "gdn-fwd": lambda: (jax.jit(gdn), (q, k, v, g, beta)),
        "gdn-fwdbwd": lambda: (bk.fwd_bwd(gdn, 5), (q, k, v, g, beta, do)),
        "linear-fwdbwd": lambda: (bk.fwd_bwd(linear, 3), (q, k, v, do)),
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


def time_gdn_fwd(b, t, tuning=DEFAULT_TUNING):
    """Seconds of the Pallas GDN forward at (b, t) and tuning (the benchmark's inputs and
    timer)."""
    xs = bk.gdn_inputs(jax.random.PRNGKey(b * t), b, t)
    return bk.time_jax(jax.jit(bk.gdn_fn("pallas", tuning)), *xs)


def time_gdn_fwdbwd(b, t, tuning=DEFAULT_TUNING):
    """Seconds of the Pallas GDN forward + backward at (b, t) and tuning."""
    xs = bk.gdn_inputs(jax.random.PRNGKey(b * t), b, t)
    return bk.time_jax(bk.fwd_bwd(bk.gdn_fn("pallas", tuning), 5), *xs,
                       jnp.ones_like(xs[2]))


def tune(out):
    """Settings timed side by side (bench_kernels.time_jax); a row per setting."""
    from kernels.pallas import decode
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

    for minbv in (32, 16):
        tuning = dataclasses.replace(DEFAULT_TUNING, min_block_v=minbv)
        setting = f"min block_v={minbv}"
        attempt("gdn fwd B1 T32768", setting, lambda: time_gdn_fwd(1, 32768, tuning))
        attempt("gdn fwd+bwd B1 T32768", setting, lambda: time_gdn_fwdbwd(1, 32768, tuning))
        attempt("gdn fwd+bwd B2 T8192", setting, lambda: time_gdn_fwdbwd(2, 8192, tuning))
    return rows


def tune_settings(name, base=DEFAULT_TUNING):
    """The Tunings a --tune-seq run compares (name: --settings): base first, then base
    with one field changed per setting (a change base already has is left out), and the
    cases [(case, timer, B, T)] it times them on."""
    if name == "prep":
        # the preparation's solve, which only the forward's cases need: its products'
        # precision and its kernel's warps
        changes = ({"solve_precision": "highest"}, {"kkt_solve_warps": 2})
        cases_ = (("fwd B8 T2048", time_gdn_fwd, 8, 2048),
                  ("fwd B2 T8192", time_gdn_fwd, 2, 8192),
                  ("fwd B1 T32768", time_gdn_fwd, 1, 32768))
    else:
        # the shapes with targets: GDN fwd at all three, fwd+bwd at T8192 and T32768
        cases_ = (("fwd B8 T2048", time_gdn_fwd, 8, 2048),
                  ("fwd+bwd B2 T8192", time_gdn_fwdbwd, 2, 8192),
                  ("fwd B1 T32768", time_gdn_fwd, 1, 32768),
                  ("fwd+bwd B1 T32768", time_gdn_fwdbwd, 1, 32768))
        changes = (
            # the W/Ut/P kernel's warps and the sequential loops'
            ({"wu_warps": 4}, {"seq_warps": 8}) if name == "warps"
            # seq_programs 64: value blocks twice as wide in the sequential loops, half
            # the programs, for the long single-sequence case
            else ({"prep_bwd_warps": 8}, {"output_warps": 8}, {"seq_stages": 2},
                  {"seq_programs": 64}))
    settings = [base] + [dataclasses.replace(base, **change) for change in changes]
    return list(dict.fromkeys(settings)), cases_


def fla_anchor_rows(cases_):
    """fla's chunk_gated_delta_rule forward at the cases' forward shapes, timed in this
    process (bench_kernels' inputs and timer): {case: ms}."""
    torch, fops = bk.fla_module()
    if fops is None:
        return {}
    return {name: bk.fla_rows(torch, fops, b, t)["gdn"] * 1e3
            for name, timer, b, t in cases_ if timer is time_gdn_fwd}


def tune_sequential(out, which="seq", fla=False, base=DEFAULT_TUNING):
    """The Tunings of tune_settings(which, base) (warps and stages of the sequential
    loops, the gradient, output, preparation and solve kernels' warps, the solve's
    precision, ...), each timed side by side on its cases (a setting that fails on one
    case, e.g. out of shared memory, counts as infinitely slow); fla: fla's forward too,
    at the forward cases' shapes. Writes DIR/seq.json (a row per Tuning: its fields and
    ms per case) and DIR/best_seq.tuning (the Tuning with the least summed time, as the
    --tuning string of every field) after every row, so a job cut short by its timeout
    keeps what it timed. Returns the fastest Tuning."""
    settings, cases_ = tune_settings(which, base)
    total = lambda row: sum(row[name] for name, *_ in cases_)  # noqa: E731
    timed, anchor = [], []   # timed: (Tuning, row)

    def fastest():
        return min(timed, key=lambda item: total(item[1]))[0]

    def write():
        if not out:
            return
        d = pathlib.Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "seq.json").write_text(json.dumps(anchor + [row for _, row in timed],
                                               indent=1))
        if timed:
            (d / "best_seq.tuning").write_text(bk.tuning_spec(fastest()) + "\n")

    if fla:  # the anchor, side by side, first (a timeout then cuts settings, not it)
        times = fla_anchor_rows(cases_)
        anchor.append({"impl": "fla", **times})
        print("  fla: " + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()),
              flush=True)
        write()
    for st in settings:
        label = bk.tuning_spec(st, base) or "base"
        times = {}
        for name, timer, b, t in cases_:
            try:
                times[name] = timer(b, t, st)
            except Exception as e:  # noqa: BLE001
                print(f"  seq {label} {name}: FAILED {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}", flush=True)
                times[name] = float("inf")
        timed.append((st, {**dataclasses.asdict(st),
                           **{k: v * 1e3 for k, v in times.items()}}))
        print(f"  seq {label}: " + ", ".join(f"{k} {v * 1e3:.3f} ms"
                                            for k, v in times.items()), flush=True)
        write()
    best = fastest()
    print(f"  best: {bk.tuning_spec(best, base) or 'base'} (--tuning "
          f"{bk.tuning_spec(best)})", flush=True)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="8x2048,2x8192,1x32768")
    ap.add_argument("--what", default=",".join(CASES),
                    help=f"comma list of cases ({', '.join(CASES)})")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--tuning", default="", metavar="KEY=VALUE,...",
                    help="the Pallas ops' kernels.pallas.Tuning: DEFAULT_TUNING with "
                         "these fields replaced (with --tune-seq: the Tuning each setting "
                         "changes one field of)")
    ap.add_argument("--tune", action="store_true", help="time the tunables instead")
    ap.add_argument("--settings", default="seq", choices=("seq", "prep", "warps"),
                    help="which settings --tune-seq compares (tune_settings)")
    ap.add_argument("--fla", action="store_true",
                    help="profile fla's chunk_gated_delta_rule forward instead "
                         "(torch.profiler; in its own process: it holds CUPTI); with "
                         "--tune-seq, time it beside the settings")
    ap.add_argument("--tune-seq", action="store_true",
                    help="time Tunings of the GPU kernels side by side instead")
    args = ap.parse_args(argv)
    try:
        tuning = bk.parse_tuning(args.tuning)
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    what = args.what.split(",")
    if set(what) - set(CASES):
        ap.error(f"--what {','.join(sorted(set(what) - set(CASES)))}: no such cases "
                 f"(choices: {', '.join(CASES)})")
    if args.tune:
        tune(args.out)
        return
    if args.tune_seq:
        tune_sequential(args.out, args.settings, args.fla, tuning)
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
        for name, fn, xs in cases(b, t, what, tuning):
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
