"""Kernel benchmark: our Pallas gated delta rule and linear attention against the pure-JAX
chunk forms, cuDNN flash attention and (when torch + fla import) flash-linear-attention.

    python scripts/bench_kernels.py [--out docs] [--shapes 8x2048,2x8192,1x32768]

Times forward, forward+backward and a one-token decode step (median of many device-
synchronised runs after warm-up); prints ms, tokens/s, the memory floor (bytes moved over
the copy bandwidth measured in the same job) and the ratio to the anchor (fla forward for
"fwd", cuDNN for "fwd+bwd", fla fused recurrent for "decode"); times the GDN backward
with both preparation backwards side by side ("pallas": the Pallas kernel, the default;
"pallas-xbwd": XLA's autodiff of the preparation; --skip xbwd to leave it out) and with
the other setting of gdn.FUSED_VJP ("pallas-fvjp1" / "pallas-fvjp0"; --skip fvjp) and of
recurrence.SPLIT_FWD ("pallas-split-always": fwd split without a gradient;
"pallas-split-never": fwd+bwd with a one-loop forward; --skip split) and of
intra.PREP_KERNELS ("pallas-prepN": the preparation as N kernels, for each N other
than the default; --skip prep) and
with the state pass as a two-level scan ("pallas-seg8": recurrence.SEQ_SEGMENTS = 8;
--segments) and at other chunk sizes ("pallas-c128": --chunks 128); times fla twice,
with triton's do_bench (the anchor) and from a CUDA graph ("fla-graph": its device time
without host launch gaps; --skip flagraph); checks
the bf16 Pallas outputs against the float32 chunk form; records peak memory of fwd+bwd at
the longest shape. Writes <out>/benchmarks.json and <out>/benchmarks.md.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import pathlib
import re
import statistics
import sys
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kernels.pallas as kp  # noqa: E402
from kernels import ops  # noqa: E402

H, D = 16, 128
DECODE_B = 64
# Chunk size of our chunkwise ops (read when traced; BENCH_CHUNK, or --chunks for rows
# "pallas-cN" beside the default): fla's chunk_gated_delta_rule uses 64.
CHUNK = int(os.environ.get("BENCH_CHUNK", "64"))

# The switches and tunables of the GPU programs that the environment sets: key ->
# (module of kernels.pallas, or "bench" for this script; attribute; environment
# variable). Every run records their values (settings()); profile_kernels --tune-seq
# varies them and writes the fastest as these variables.
KNOBS = {"prep_bwd": ("gdn", "PREP_BWD", "KERNELS_GDN_PREP_BWD"),
         "fused_vjp": ("gdn", "FUSED_VJP", "KERNELS_GDN_FUSED_VJP"),
         "seq_warps": ("recurrence", "SEQ_WARPS", "KERNELS_PALLAS_SEQ_WARPS"),
         "seq_stages": ("recurrence", "SEQ_STAGES", "KERNELS_PALLAS_SEQ_STAGES"),
         "seq_programs": ("recurrence", "SEQ_PROGRAMS", "KERNELS_PALLAS_SEQ_PROGRAMS"),
         "split_fwd": ("recurrence", "SPLIT_FWD", "KERNELS_PALLAS_SPLIT_FWD"),
         "grads_warps": ("recurrence", "GRADS_WARPS", "KERNELS_PALLAS_GRADS_WARPS"),
         "output_warps": ("recurrence", "OUTPUT_WARPS", "KERNELS_PALLAS_OUTPUT_WARPS"),
         "prep_warps": ("intra", "NUM_WARPS", "KERNELS_PALLAS_PREP_WARPS"),
         "prep_kernels": ("intra", "PREP_KERNELS", "KERNELS_PALLAS_PREP_KERNELS"),
         "seq_segments": ("recurrence", "SEQ_SEGMENTS", "KERNELS_PALLAS_SEQ_SEGMENTS"),
         "seg_stages": ("recurrence", "SEG_STAGES", "KERNELS_PALLAS_SEG_STAGES"),
         "prep_bwd_warps": ("intra_bwd", "NUM_WARPS", "KERNELS_PALLAS_PREP_BWD_WARPS"),
         "chunk": ("bench", "CHUNK", "BENCH_CHUNK"),
         "solve_warps": ("intra_split", "SOLVE_WARPS", "KERNELS_PALLAS_SOLVE_WARPS"),
         "diag_inverse": ("intra", "DIAG_INVERSE", "KERNELS_PALLAS_DIAG_INVERSE"),
         "kkt_solve_warps": ("intra_split", "KKT_SOLVE_WARPS",
                             "KERNELS_PALLAS_KKT_SOLVE_WARPS"),
         "solve_precision": ("intra", "SOLVE_PRECISION", "KERNELS_PALLAS_SOLVE_PRECISION"),
         "wu_warps": ("intra_split", "WU_WARPS", "KERNELS_PALLAS_WU_WARPS")}


def knob(key):
    """(module, attribute) of KNOBS[key]."""
    name, attr, _ = KNOBS[key]
    module = (sys.modules[__name__] if name == "bench"
              else importlib.import_module(f"kernels.pallas.{name}"))
    return module, attr


def settings():
    """The current value of every knob (seq_warps 0 as "auto": its automatic choice),
    and MIN_BLOCK_V, which no variable sets: what a run records it timed with."""
    from kernels.pallas import recurrence
    values = {key: getattr(*knob(key)) for key in KNOBS}
    values["seq_warps"] = values["seq_warps"] or "auto"
    return {**values, "min_block_v": recurrence.MIN_BLOCK_V}


# ----------------------------------------------------------------------------- timing

def time_jax(fn, *args, samples=15, target_s=0.02):
    """Median seconds per call: calls are queued back to back and synchronised once per
    sample, so host dispatch overlaps device work as in a training loop."""
    jax.block_until_ready(fn(*args))          # compile
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = time.perf_counter() - t0
    reps = int(max(1, min(100, target_s / max(once, 1e-6))))
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def time_torch(fn, graph=False):
    """Median seconds per call of a torch function: triton's do_bench (host launches
    included where they outrun the GPU), or with graph=True from a replayed CUDA graph
    (device time alone: fla's B8 T2048 times vary ~2x between jobs, its T32768 ones do
    not, which points at host-side launch overhead)."""
    import triton.testing
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") / 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3


def copy_bandwidth():
    """Bytes read + written per second by a large device copy (x + 1 over 2 GiB of bf16)."""
    x = jnp.ones((1024, 1024 * 1024), jnp.bfloat16)
    f = jax.jit(lambda a: a + 1)
    s = time_jax(f, x, samples=10)
    return 2 * x.size * x.dtype.itemsize / s


# ----------------------------------------------------------------------------- inputs

def gdn_inputs(key, b, t, dtype=jnp.bfloat16):
    """As fla benchmarks them: g = logsigmoid(randn), beta = sigmoid(rand), L2-normalised
    q and k."""
    kq, kk, kv, kg, kb = jax.random.split(key, 5)
    norm = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = norm(jax.random.normal(kq, (b, t, H, D), jnp.float32)).astype(dtype)
    k = norm(jax.random.normal(kk, (b, t, H, D), jnp.float32)).astype(dtype)
    v = jax.random.normal(kv, (b, t, H, D), jnp.float32).astype(dtype)
    g = jax.nn.log_sigmoid(jax.random.normal(kg, (b, t, H), jnp.float32))
    beta = jax.nn.sigmoid(jax.random.uniform(kb, (b, t, H), jnp.float32))
    return q, k, v, g, beta


def decode_inputs(key=None):
    """One decoding step's q, k, v, log_alpha, beta and float32 state, B64 (DECODE_B) H D."""
    ks = jax.random.split(jax.random.PRNGKey(7) if key is None else key, 6)
    shape = (DECODE_B, H, D)
    q = jax.random.normal(ks[0], shape, jnp.bfloat16)
    k = jax.random.normal(ks[1], shape, jnp.float32)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], shape, jnp.bfloat16)
    g = jax.nn.log_sigmoid(jax.random.normal(ks[3], shape[:2]))
    beta = jax.nn.sigmoid(jax.random.uniform(ks[4], shape[:2]))
    state = jax.random.normal(ks[5], shape + (D,), jnp.float32)
    return q, k, v, g, beta, state


def la_inputs(key, b, t, dtype=jnp.bfloat16):
    """Positive features (a feature map's output), normalised so sums stay O(1)."""
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.nn.softmax(jax.random.normal(kq, (b, t, H, D), jnp.float32), -1).astype(dtype)
    k = jax.nn.softmax(jax.random.normal(kk, (b, t, H, D), jnp.float32), -1).astype(dtype)
    v = jax.random.normal(kv, (b, t, H, D), jnp.float32).astype(dtype)
    return q, k, v


# ----------------------------------------------------------------------------- our ops

def gdn_fn(impl):
    def f(q, k, v, g, beta):
        if impl == "pallas":
            return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK)
        if impl == "pallas-xlaprep":   # Pallas recurrence, XLA chunk preparation
            return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK, fused_prep=False)
        if impl == "pallas-bv64":      # the recurrence with 64 value columns per program
            return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK, block_v_cols=64)
        return ops.gated_delta_rule(q, k, v, g, beta, impl=impl, chunk_size=CHUNK)
    return f


def la_fn(impl):
    def f(q, k, v):
        if impl == "pallas":
            return kp.linear_attention(q, k, v, normalize=True, chunk_size=CHUNK)
        return ops.linear_attention(q, k, v, normalize=True, impl=impl, chunk_size=CHUNK)
    return f


def with_setting(f, module, name, value):
    """f with module.name = value while it runs (so while jit traces it: the kernels read
    their tunables when traced)."""
    def g(*args):
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            return f(*args)
        finally:
            setattr(module, name, saved)
    return g


def cudnn_fn(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", is_causal=True)


def fwd_bwd(f, ndiff, prep_bwd=None):
    """jit of f's outputs and its VJP w.r.t. its first ndiff arguments with a fixed
    cotangent: a training step's work. (Returning the outputs matters: without them XLA
    drops whatever computes only O, e.g. the split forward's output pass, and the time
    would not be what a model pays.)
    prep_bwd: the GDN preparation's backward ("xla" | "pallas"), chosen while tracing
    (it is read when the backward is traced, so it must hold beyond f's own call)."""
    from kernels.pallas import gdn

    def run(*args):
        out, pull = jax.vjp(lambda *d: f(*d, *args[ndiff:-1]), *args[:ndiff])
        return out, pull(args[-1])
    # the setting must hold while the backward is traced too: around all of run
    return jax.jit(with_setting(run, gdn, "PREP_BWD", prep_bwd) if prep_bwd else run)


def breakdown(q, k, v, g, beta):
    """Where the GDN forward goes: the chunk preparation (Pallas one-pass vs XLA) alone."""
    from kernels.pallas import gdn
    c = CHUNK
    for name, fn in (("prep_pallas", gdn.prep_pallas), ("prep_xla", gdn.prep_xla)):
        s = time_jax(jax.jit(lambda *a: fn(*a, c)), q, k, v, g, beta)
        print(f"# breakdown {name} {q.shape}: {s * 1e3:.3f} ms", flush=True)


def rel_rms(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.sqrt(jnp.mean((a - b) ** 2)) / jnp.sqrt(jnp.mean(b ** 2)))


# ----------------------------------------------------------------------------- fla

def fla_module():
    try:
        import torch
        import fla.ops as fops
        assert torch.cuda.is_available()
        return torch, fops
    except Exception as e:  # noqa: BLE001
        print(f"# fla not available: {type(e).__name__}: {e}")
        return None, None


def fla_gdn_inputs(torch, b, t):
    """fla's gated-delta-rule inputs on the GPU, as gdn_inputs makes ours: unit q and k,
    bf16 q k v, float32 log-decays (logsigmoid) and beta in (0.5, 0.73)."""
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(b, t, H, D, device=dev), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(b, t, H, D, device=dev), dim=-1).bfloat16()
    v = torch.randn(b, t, H, D, device=dev).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(b, t, H, device=dev)).float()
    beta = torch.rand(b, t, H, device=dev).sigmoid().float()
    return q, k, v, g, beta


def fla_rows(torch, fops, b, t, graph=False):
    out = {}
    dev = "cuda"
    q, k, v, g, beta = fla_gdn_inputs(torch, b, t)
    with torch.no_grad():
        out["gdn"] = time_torch(lambda: fops.chunk_gated_delta_rule(q, k, v, g, beta), graph)
        qa, ka = (torch.softmax(torch.randn(b, t, H, D, device=dev), -1).bfloat16()
                  for _ in range(2))
        out["linear"] = time_torch(lambda: fops.chunk_linear_attn(qa, ka, v, normalize=True),
                                   graph)
    return out


def fla_decode(torch, fops):
    q, k, v, g, beta = fla_gdn_inputs(torch, DECODE_B, 1)
    s = torch.randn(DECODE_B, H, D, D, device="cuda").float()
    with torch.no_grad():
        return time_torch(lambda: fops.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta=beta, initial_state=s, output_final_state=True))


# ----------------------------------------------------------------------------- main

def main():
    global H, D
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[1] / "docs"))
    ap.add_argument("--shapes", default="8x2048,2x8192,1x32768")
    ap.add_argument("--skip", default="", help="comma list of impls to skip (chunk, fla, ...)")
    ap.add_argument("--chunk-shapes", default="",
                    help="time the pure-JAX chunk forms only at these shapes (default: all)")
    ap.add_argument("--xlaprep", action="store_true",
                    help="also time GDN with the XLA chunk preparation, and a breakdown")
    ap.add_argument("--segments", default="8",
                    help="comma list of recurrence.SEQ_SEGMENTS values (> 1) to time beside "
                         "the default ('' for none)")
    ap.add_argument("--chunks", default="",
                    help="comma list of other chunk sizes to time beside CHUNK (rows "
                         "'pallas-cN')")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="skip the remaining timings after this many seconds (files are "
                         "still written)")
    ap.add_argument("--heads", type=int, default=H, help="heads (16; smaller for smoke tests)")
    ap.add_argument("--dim", type=int, default=D, help="head dim (128)")
    ap.add_argument("--from-log", nargs="+", metavar="LOG[@COMMIT]",
                    help="rebuild the outputs from the printed logs of earlier runs (one "
                         "run each; ratios only within a run) instead of measuring")
    args = ap.parse_args()
    H, D = args.heads, args.dim
    if args.from_log:
        runs = [parse_log(*(spec.split("@", 1) + [None])[:2], run=i + 1)
                for i, spec in enumerate(args.from_log)]
        write_outputs(pathlib.Path(args.out), runs)
        print(markdown(runs))
        return
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    args.segments = [int(x) for x in args.segments.split(",") if x]
    args.chunks = [int(x) for x in args.chunks.split(",") if x and int(x) != CHUNK]
    chunk_shapes = ({tuple(int(x) for x in s.split("x")) for s in args.chunk_shapes.split(",")}
                    if args.chunk_shapes else set(shapes))
    start = time.perf_counter()
    dev = jax.devices()[0]
    device = getattr(dev, "device_kind", str(dev))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print(f"# device {device}, jax {jax.__version__}, {date}")
    print("# command python scripts/bench_kernels.py " + " ".join(sys.argv[1:]))
    records, notes = [], []

    def record(op, impl, pss, b, t, seconds, floor_bytes, extra=None):
        rec = {"op": op, "impl": impl, "pass": pss, "B": b, "T": t, "H": H, "D": D,
               "ms": round(seconds * 1e3, 4), "device": device, "jax": jax.__version__,
               "date": date, "floor_ms": round(floor_bytes / bw * 1e3, 4)}
        if extra:
            rec.update(extra)
        records.append(rec)
        flush()
        print(f"{op:8s} {impl:16s} {pss:8s} B{b:<2d} T{t:<6d} {seconds * 1e3:9.3f} ms "
              f"{b * t / seconds / 1e6:9.2f} Mtok/s  floor {rec['floor_ms']:.3f} ms", flush=True)

    from kernels.pallas import gdn as kp_gdn, intra as kp_intra, recurrence as kp_rec
    run_settings = settings()
    print(f"# kernel settings {run_settings}")
    run_meta = {"run": 1, "commit": git_commit(), "settings": run_settings,
                "copy_bandwidth_TBps": None,
                "peak_memory": {}, "accuracy_rel_rms": {}, "failures": notes,
                "command": "python scripts/bench_kernels.py " + " ".join(sys.argv[1:]),
                "records": records}

    def flush():
        """Write the outputs after every row, so a job cut short still leaves its data."""
        write_outputs(pathlib.Path(args.out), [run_meta])

    def attempt(label, fn):
        if time.perf_counter() - start > args.budget_s:
            notes.append(f"{label}: skipped (time budget)")
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  (one failing row must not stop the job)
            msg = f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            print("# FAILED " + msg, flush=True)
            traceback.print_exc(limit=3)
            notes.append(msg)
            return None

    # peak memory first, while nothing else is allocated
    bmax, tmax = max(shapes, key=lambda s: s[1])
    peaks = run_meta["peak_memory"]
    for op in ("gdn", "linear"):
        def peak(op=op):
            key = jax.random.PRNGKey(0)
            if op == "gdn":
                xs = gdn_inputs(key, bmax, tmax)
                f = fwd_bwd(gdn_fn("pallas"), 5)
            else:
                xs = la_inputs(key, bmax, tmax)
                f = fwd_bwd(la_fn("pallas"), 3)
            do = jnp.ones_like(xs[2])
            base = dev.memory_stats().get("peak_bytes_in_use", 0)
            jax.block_until_ready(f(*xs, do))
            stats = dev.memory_stats()
            inputs = sum(x.nbytes for x in xs) + do.nbytes
            # the process-wide peak only grows, so also ask the compiled program itself
            mem = f.lower(*xs, do).compile().memory_analysis()
            temp = getattr(mem, "temp_size_in_bytes", None)
            peaks[op] = {"peak_bytes": stats["peak_bytes_in_use"], "before": base,
                         "inputs_bytes": inputs, "compiled_temp_bytes": temp}
            print(f"# peak memory {op} fwd+bwd B{bmax} T{tmax}: process peak "
                  f"{stats['peak_bytes_in_use'] / 2**30:.2f} GiB, program temporaries "
                  f"{(temp or 0) / 2**30:.2f} GiB (inputs {inputs / 2**30:.2f} GiB)",
                  flush=True)
        attempt(f"peak {op}", peak)

    bw = copy_bandwidth()
    run_meta["copy_bandwidth_TBps"] = round(bw / 1e12, 3)
    print(f"# copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    torch, fops = (None, None) if "fla" in skip else fla_module()

    checks = run_meta["accuracy_rel_rms"]
    # decode: one token, B64 H16 D128, float32 state
    qd, kd_, vd, gd, bd, sd = decode_inputs()
    dec_bytes = 2 * sd.nbytes
    xla_step = jax.jit(kp.gated_delta_step, donate_argnums=(5,))

    def run_decode(step, name):
        state = {"s": jnp.array(sd)}

        def call():
            o, state["s"] = step(qd, kd_, vd, gd, bd, state["s"])
            return o
        s = time_jax(lambda: call())
        record("gdn", name, "decode", DECODE_B, 1, s, dec_bytes)
    attempt("decode xla", lambda: run_decode(xla_step, "xla-step"))
    attempt("decode pallas", lambda: run_decode(kp.gated_delta_step_pallas, "pallas-step"))

    def dec_check():
        o1, s1 = kp.gated_delta_step(qd, kd_, vd, gd, bd, sd)
        o2, s2 = kp.gated_delta_step_pallas(qd, kd_, vd, gd, bd, jnp.array(sd))
        checks["decode_pallas_vs_xla"] = {"o": rel_rms(o2, o1), "state": rel_rms(s2, s1)}
        print(f"# decode pallas vs xla: {checks['decode_pallas_vs_xla']}")
    attempt("decode check", dec_check)
    if fops is not None:
        s = attempt("fla decode", lambda: fla_decode(torch, fops))
        if s:
            record("gdn", "fla-fused-recurrent", "decode", DECODE_B, 1, s, dec_bytes)

    for b, t in shapes:
        n_tok = b * t * H * D
        fwd_bytes = 4 * n_tok * 2            # q, k, v read, o written (bf16)
        fb_bytes = 11 * n_tok * 2            # + do, q, k, v read; dq, dk, dv written
        key = jax.random.PRNGKey(b * t)
        q, k, v, g, beta = gdn_inputs(key, b, t)
        qa, ka, va = la_inputs(jax.random.fold_in(key, 1), b, t)
        do = jax.random.normal(jax.random.fold_in(key, 2), v.shape, jnp.float32).astype(v.dtype)
        def setting_rows(name, module, attr, value, cases):
            """Rows `name` of the Pallas ops with module.attr = value while the forward is
            traced (where the kernels read their switches; a backward follows the
            forward's residuals), for cases [(op, pass)], beside the default rows."""
            for op, pss in cases:
                fn, xs = (gdn_fn, (q, k, v, g, beta)) if op == "gdn" else (la_fn, (qa, ka, va))
                f = with_setting(fn("pallas"), module, attr, value)
                timed, xs = ((jax.jit(f), xs) if pss == "fwd"
                             else (fwd_bwd(f, len(xs)), (*xs, do)))
                attempt(f"{op} {name} {pss} {b}x{t}", lambda: record(
                    op, name, pss, b, t, time_jax(timed, *xs),
                    fwd_bytes if pss == "fwd" else fb_bytes))

        for impl in ("pallas", "pallas-xlaprep", "chunk"):
            if impl in skip or (impl == "chunk" and (b, t) not in chunk_shapes):
                continue
            if impl == "pallas-xlaprep" and not args.xlaprep:
                continue
            attempt(f"gdn {impl} fwd {b}x{t}", lambda: record(
                "gdn", impl, "fwd", b, t, time_jax(jax.jit(gdn_fn(impl)), q, k, v, g, beta),
                fwd_bytes))
            attempt(f"gdn {impl} fwd+bwd {b}x{t}", lambda: record(
                "gdn", impl, "fwd+bwd", b, t,
                time_jax(fwd_bwd(gdn_fn(impl), 5), q, k, v, g, beta, do), fb_bytes))
            if impl == "pallas" and "fvjp" not in skip:  # the other FUSED_VJP setting
                other = not kp_gdn.FUSED_VJP
                setting_rows(f"pallas-fvjp{int(other)}", kp_gdn, "FUSED_VJP", other,
                             [("gdn", "fwd+bwd")])
            if impl == "pallas" and "split" not in skip:  # the other forward layouts
                # (recurrence.SPLIT_FWD): split without a gradient, one loop with one
                for mode, cases in (("always", [("gdn", "fwd")]), ("never", [("gdn", "fwd+bwd")]),
                                    ("always", [("linear", "fwd")])):
                    if mode != kp_rec.SPLIT_FWD:
                        setting_rows(f"pallas-split-{mode}", kp_rec, "SPLIT_FWD", mode, cases)
            for segs in (args.segments if impl == "pallas" else []):  # two-level scan
                setting_rows(f"pallas-seg{segs}", kp_rec, "SEQ_SEGMENTS", segs,
                             [("gdn", "fwd"), ("gdn", "fwd+bwd"), ("linear", "fwd")])
            for c in (args.chunks if impl == "pallas" else []):  # other chunk sizes
                setting_rows(f"pallas-c{c}", sys.modules[__name__], "CHUNK", c,
                             [("gdn", "fwd"), ("gdn", "fwd+bwd"), ("linear", "fwd"),
                              ("linear", "fwd+bwd")])
            for n_prep in kp_intra.PREP_KERNELS_CHOICES:  # the preparation as n kernels
                if impl == "pallas" and "prep" not in skip and n_prep != kp_intra.PREP_KERNELS:
                    setting_rows(f"pallas-prep{n_prep}", kp_intra, "PREP_KERNELS", n_prep,
                                 [("gdn", "fwd"), ("gdn", "fwd+bwd")])
            if impl == "pallas" and "xbwd" not in skip:  # XLA's preparation backward
                attempt(f"gdn pallas-xbwd fwd+bwd {b}x{t}", lambda: record(
                    "gdn", "pallas-xbwd", "fwd+bwd", b, t,
                    time_jax(fwd_bwd(gdn_fn("pallas"), 5, "xla"), q, k, v, g, beta, do),
                    fb_bytes))
            if impl == "pallas-xlaprep":
                if b * t == 16384 and t == 8192:
                    attempt("breakdown", lambda: breakdown(q, k, v, g, beta))
                continue
            attempt(f"linear {impl} fwd {b}x{t}", lambda: record(
                "linear", impl, "fwd", b, t, time_jax(jax.jit(la_fn(impl)), qa, ka, va),
                fwd_bytes))
            attempt(f"linear {impl} fwd+bwd {b}x{t}", lambda: record(
                "linear", impl, "fwd+bwd", b, t,
                time_jax(fwd_bwd(la_fn(impl), 3), qa, ka, va, do), fb_bytes))
        if b * H < 64 and "bv64" not in skip:   # where the adaptive split differs
            attempt(f"gdn pallas-bv64 fwd {b}x{t}", lambda: record(
                "gdn", "pallas-bv64", "fwd", b, t,
                time_jax(jax.jit(gdn_fn("pallas-bv64")), q, k, v, g, beta), fwd_bytes))
        if "cudnn" not in skip:
            attempt(f"cudnn fwd {b}x{t}", lambda: record(
                "softmax", "cudnn", "fwd", b, t, time_jax(jax.jit(cudnn_fn), q, k, v),
                fwd_bytes))
            attempt(f"cudnn fwd+bwd {b}x{t}", lambda: record(
                "softmax", "cudnn", "fwd+bwd", b, t,
                time_jax(fwd_bwd(cudnn_fn, 3), q, k, v, do), fb_bytes))
        if fops is not None:
            res = attempt(f"fla {b}x{t}", lambda: fla_rows(torch, fops, b, t))
            for op, s in (res or {}).items():
                record(op, "fla", "fwd", b, t, s, fwd_bytes)
            if "flagraph" not in skip:   # fla's device time alone (not the anchor)
                res = attempt(f"fla-graph {b}x{t}",
                              lambda: fla_rows(torch, fops, b, t, graph=True))
                for op, s in (res or {}).items():
                    record(op, "fla-graph", "fwd", b, t, s, fwd_bytes)

        # accuracy: bf16 Pallas against the float32 chunk form on the same inputs
        def acc():
            f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
            ref = jax.jit(gdn_fn("chunk"))(f32(q), f32(k), f32(v), g, beta)
            got = jax.jit(gdn_fn("pallas"))(q, k, v, g, beta)
            # the gradients (fwd_bwd also returns the outputs)
            gref = fwd_bwd(gdn_fn("chunk"), 3)(f32(q), f32(k), f32(v), g, beta, f32(do))[1]
            ggot = fwd_bwd(gdn_fn("pallas"), 3)(q, k, v, g, beta, do)[1]
            gpb = fwd_bwd(gdn_fn("pallas"), 3, "xla")(q, k, v, g, beta, do)[1]
            la_ref = jax.jit(la_fn("chunk"))(f32(qa), f32(ka), f32(va))
            la_got = jax.jit(la_fn("pallas"))(qa, ka, va)
            c = {"gdn_o": rel_rms(got, ref), "linear_o": rel_rms(la_got, la_ref)}
            for name, a_, r_ in zip(("gdn_dq", "gdn_dk", "gdn_dv"), ggot, gref):
                c[name] = rel_rms(a_, r_)
            for name, a_, r_ in zip(("xbwd_dq", "xbwd_dk", "xbwd_dv"), gpb, gref):
                c[name] = rel_rms(a_, r_)
            checks[f"{b}x{t}"] = c
            print(f"# rel RMS error bf16 pallas vs f32 chunk {b}x{t}: "
                  + ", ".join(f"{n} {x:.2e}" for n, x in c.items()), flush=True)
        if (b, t) in chunk_shapes and b * t <= 16384:   # also with the chunk rows skipped
            attempt(f"accuracy {b}x{t}", acc)

    write_outputs(pathlib.Path(args.out), [run_meta])
    print(markdown([run_meta]))


def git_commit():
    """The code's commit: $BENCH_COMMIT if set (a copied tree may carry a stale .git),
    else git's HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        import subprocess
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def add_ratios(records):
    """ratio_to_anchor: fla forward for "fwd", cuDNN for "fwd+bwd", fla fused recurrent for
    "decode", taken from the same run only."""
    for rec in records:
        want = {"fwd": ("fla", rec["op"]), "fwd+bwd": ("cudnn", "softmax"),
                "decode": ("fla-fused-recurrent", "gdn")}[rec["pass"]]
        ref = [r["ms"] for r in records
               if (r["impl"], r["op"], r["pass"], r["B"], r["T"])
               == (*want, rec["pass"], rec["B"], rec["T"])]
        rec["ratio_to_anchor"] = round(rec["ms"] / ref[0], 3) if ref else None


def write_outputs(out, runs):
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for meta in runs:
        add_ratios(meta["records"])
        for r in meta["records"]:
            records.append({**r, "run": meta["run"], "commit": meta["commit"]})
    (out / "benchmarks.json").write_text(json.dumps(records, indent=1) + "\n")
    (out / "benchmarks.md").write_text(markdown(runs))


ROW = re.compile(r"^(\w+)\s+(\S+)\s+(fwd\+bwd|fwd|decode)\s+B(\d+)\s+T(\d+)\s+([\d.]+) ms"
                 r".*floor ([\d.]+) ms")


def parse_log(path, commit=None, run=None):
    """One run's printed output -> the run's meta and records (what a live run writes)."""
    text = pathlib.Path(path).read_text()
    device = jax_version = date = None
    meta = {"run": run, "commit": commit, "copy_bandwidth_TBps": None, "peak_memory": {},
            "accuracy_rel_rms": {}, "failures": [], "records": [],
            "command": f"python scripts/bench_kernels.py (log {pathlib.Path(path).name})"}
    for line in text.splitlines():
        if m := re.match(r"# device (.*), jax (\S+), (\S+)", line):
            device, jax_version, date = m.groups()
        elif m := re.match(r"# command (.*)", line):
            meta["command"] = m.group(1)
        elif m := re.match(r"# copy bandwidth ([\d.]+) TB/s", line):
            meta["copy_bandwidth_TBps"] = float(m.group(1))
        elif m := re.match(r"# peak memory (\w+) fwd\+bwd B\d+ T\d+: (?:process peak )?"
                           r"([\d.]+) GiB(?:, program temporaries ([\d.]+) GiB)?"
                           r" \(inputs ([\d.]+) GiB\)", line):
            op, peak, temp, inputs = m.groups()
            meta["peak_memory"][op] = {
                "peak_bytes": float(peak) * 2**30, "inputs_bytes": float(inputs) * 2**30,
                "compiled_temp_bytes": None if temp is None else float(temp) * 2**30}
        elif m := re.match(r"# rel RMS error bf16 pallas vs f32 chunk (\S+): (.*)", line):
            meta["accuracy_rel_rms"][m.group(1)] = {
                name: float(val) for name, val in
                (item.split() for item in m.group(2).split(", "))}
        elif m := re.match(r"# decode pallas vs xla: (\{.*\})", line):
            import ast
            meta["accuracy_rel_rms"]["decode_pallas_vs_xla"] = ast.literal_eval(m.group(1))
        elif m := re.match(r"# FAILED (.*)", line):
            meta["failures"].append(m.group(1))
        elif m := ROW.match(line):
            op, impl, pss, b, t, ms, floor = m.groups()
            meta["records"].append({"op": op, "impl": impl, "pass": pss, "B": int(b),
                                    "T": int(t), "H": H, "D": D, "ms": float(ms),
                                    "device": device, "jax": jax_version, "date": date,
                                    "floor_ms": float(floor)})
    return meta


def markdown(runs):
    """One table per run (ratios are only taken within a run: the machines are shared and
    noisy, so anchors are re-measured side by side)."""
    lines = ["# Kernel benchmarks", "",
             "Made by scripts/bench_kernels.py from docs/benchmarks.json. bf16 inputs, float32 "
             "state, H16 D128, chunk 64 unless the run's settings or the impl (pallas-cN) say "
             "otherwise; median ms of device-synchronised runs after warm-up.",
             "Anchor (x anchor column): fla forward for `fwd`, cuDNN flash attention for "
             "`fwd+bwd`, fla fused recurrent for `decode`, from the same run. Floor: bytes "
             "read + written over the copy bandwidth measured in the same run.", ""]
    for meta in runs:
        recs = meta["records"]
        head = recs[0] if recs else {}
        lines += [f"## Run {meta['run']} (code {meta.get('commit') or '?'})", "",
                  f"`{meta['command']}`; {head.get('device', '?')}, jax "
                  f"{head.get('jax', '?')}, {head.get('date', '?')}; copy bandwidth "
                  f"{meta['copy_bandwidth_TBps']} TB/s."
                  + (f" Kernel settings: {meta['settings']}." if meta.get("settings") else ""),
                  "", "| op | impl | pass | B | T | ms | Mtok/s | floor ms | x anchor |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(recs, key=lambda r: (r["pass"], r["T"], r["op"], r["impl"])):
            tok = r["B"] * r["T"] / (r["ms"] / 1e3) / 1e6
            ratio = "" if r.get("ratio_to_anchor") is None else f"{r['ratio_to_anchor']:.2f}"
            lines.append(f"| {r['op']} | {r['impl']} | {r['pass']} | {r['B']} | {r['T']} | "
                         f"{r['ms']:.3f} | {tok:.1f} | {r['floor_ms']:.3f} | {ratio} |")
        if meta["peak_memory"]:
            lines += ["", "Peak memory of fwd+bwd at the longest shape:", ""]
            for op, p in meta["peak_memory"].items():
                temp = p.get("compiled_temp_bytes")
                lines.append(
                    f"- {op}: process peak {p['peak_bytes'] / 2**30:.2f} GiB"
                    + ("" if temp is None else
                       f", the compiled fwd+bwd program's temporaries {temp / 2**30:.2f} GiB")
                    + f" (inputs + cotangent {p['inputs_bytes'] / 2**30:.2f} GiB)")
        if meta["accuracy_rel_rms"]:
            lines += ["", "Relative RMS error, bf16 Pallas against the float32 form:", ""]
            for shape, c in meta["accuracy_rel_rms"].items():
                lines.append(f"- {shape}: " + ", ".join(f"{k} {v:.2e}" for k, v in c.items()))
        if meta["failures"]:
            lines += ["", "Rows that failed or were skipped:", ""]
            lines += [f"- {f}" for f in meta["failures"]]
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
