"""Kernel benchmark: our Pallas gated delta rule and linear attention against the pure-JAX
chunk forms, cuDNN flash attention and (when torch + fla import) flash-linear-attention.

    python scripts/bench_kernels.py [--out docs] [--shapes 8x2048,2x8192,1x32768]
    python scripts/bench_kernels.py --tuning seq_stages=2,wu_warps=4 [--chunk 32]
    python scripts/bench_kernels.py --variant w4:wu_warps=4 --variant s2:seq_stages=2

Times forward, forward+backward and a one-token decode step (median of many device-
synchronised runs after warm-up); prints ms, tokens/s, the memory floor (bytes moved over
the copy bandwidth measured in the same job) and the ratio to the anchor (fla forward for
"fwd", cuDNN for "fwd+bwd", fla fused recurrent for "decode"). The Pallas rows run at one
kernels.pallas.Tuning, DEFAULT_TUNING with the fields --tuning names replaced (the string
profile_kernels --tune-seq writes as best_seq.tuning), and one chunk size (--chunk); the
run records both (its kernel settings). Rows beside them, each timed in the same job:
"pallas-NAME" at the run's Tuning with the fields of --variant NAME:key=value,... replaced;
"pallas-cN" at chunk size N (--chunks); "pallas-bv64", the GDN forward with 64 value
columns per program where the adaptive split chooses fewer (--skip bv64); "pallas-xlaprep",
GDN with the XLA chunk preparation (--xlaprep); fla twice, with triton's do_bench (the
anchor) and from a CUDA graph ("fla-graph": its device time without host launch gaps;
--skip flagraph). Checks the bf16 Pallas outputs against the float32 chunk form; records
peak memory of fwd+bwd at the longest shape. Writes <out>/benchmarks.json and
<out>/benchmarks.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
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
from kernels.pallas import DEFAULT_TUNING, Tuning  # noqa: E402

# Heads and head dim of every benchmark shape (--heads / --dim change them for smoke
# tests), and the batch of the decode step.
H, D = 16, 128
DECODE_B = 64
# Chunk size of our chunkwise ops (--chunk; --chunks adds rows "pallas-cN" beside it):
# fla's chunk_gated_delta_rule uses 64.
CHUNK = 64
# --skip names: the row groups that can be left out.
SKIPPABLE = ("pallas", "chunk", "bv64", "cudnn", "fla", "flagraph", "packed")
# Packed rows: documents of log-normal lengths (mean PACKED_MEAN tokens, log-space std
# PACKED_SIGMA) back to back in each row, every row starting a new document.
PACKED_MEAN, PACKED_SIGMA = 512, 1.0


# ----------------------------------------------------------------------------- settings

def parse_tuning(spec: str, base: Tuning = DEFAULT_TUNING) -> Tuning:
    """base with the fields that spec ("key=value,...") names replaced: integers in
    digits, block_v=none for None, solve_precision by name; "" gives base. Tuning checks
    the values."""
    names = [f.name for f in dataclasses.fields(Tuning)]
    overrides = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in names:
            raise ValueError(f"tuning {item!r}: not key=value with a key of "
                             f"kernels.pallas.Tuning ({', '.join(names)})")
        overrides[key] = (None if value.lower() == "none"
                          else int(value) if value.lstrip("-").isdigit() else value)
    return dataclasses.replace(base, **overrides)


def tuning_spec(tuning: Tuning, base: Tuning | None = None) -> str:
    """tuning as parse_tuning reads it: every field (so the string selects the same
    Tuning whatever the defaults are then), or with base only those that differ from
    base's ("" for none)."""
    others = {} if base is None else dataclasses.asdict(base)
    return ",".join(f"{k}={'none' if v is None else v}"
                    for k, v in dataclasses.asdict(tuning).items()
                    if k not in others or others[k] != v)


def parse_variant(spec: str, base: Tuning) -> tuple[str, Tuning]:
    """--variant NAME:key=value,... -> (row name "pallas-NAME", base with those fields)."""
    name, sep, fields = spec.partition(":")
    if not sep or not re.fullmatch(r"\w[\w.-]*", name):
        raise ValueError(f"variant {spec!r}: not NAME:key=value,... (NAME of letters, "
                         "digits, '_', '.', '-')")
    return f"pallas-{name}", parse_tuning(fields, base)


def run_settings(tuning: Tuning, chunk: int) -> dict:
    """What a row was timed with: every field of its Tuning, and the chunk size."""
    return {**dataclasses.asdict(tuning), "chunk": chunk}


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

def gdn_inputs(key, b, t, dtype=jnp.bfloat16, h=H, d=D):
    """As fla benchmarks them: g = logsigmoid(randn), beta = sigmoid(rand), L2-normalised
    q and k."""
    kq, kk, kv, kg, kb = jax.random.split(key, 5)
    norm = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = norm(jax.random.normal(kq, (b, t, h, d), jnp.float32)).astype(dtype)
    k = norm(jax.random.normal(kk, (b, t, h, d), jnp.float32)).astype(dtype)
    v = jax.random.normal(kv, (b, t, h, d), jnp.float32).astype(dtype)
    g = jax.nn.log_sigmoid(jax.random.normal(kg, (b, t, h), jnp.float32))
    beta = jax.nn.sigmoid(jax.random.uniform(kb, (b, t, h), jnp.float32))
    return q, k, v, g, beta


def decode_inputs(key=None, h=H, d=D):
    """One decoding step's q, k, v, log_alpha, beta and float32 state, (DECODE_B, h, d)."""
    ks = jax.random.split(jax.random.PRNGKey(7) if key is None else key, 6)
    shape = (DECODE_B, h, d)
    q = jax.random.normal(ks[0], shape, jnp.bfloat16)
    k = jax.random.normal(ks[1], shape, jnp.float32)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], shape, jnp.bfloat16)
    g = jax.nn.log_sigmoid(jax.random.normal(ks[3], shape[:2]))
    beta = jax.nn.sigmoid(jax.random.uniform(ks[4], shape[:2]))
    state = jax.random.normal(ks[5], shape + (d,), jnp.float32)
    return q, k, v, g, beta, state


def packed_lengths(seed: int, b: int, t: int, mean: float = PACKED_MEAN,
                   sigma: float = PACKED_SIGMA) -> list[list[int]]:
    """Each row's document lengths: log-normal draws with the given mean (at least one
    token each), the last one cut to fill the row exactly."""
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma ** 2 / 2          # the log-normal's mean is exp(mu + s^2/2)
    rows = []
    for _ in range(b):
        lengths, left = [], t
        while left > 0:
            n = int(min(left, max(1, round(rng.lognormal(mu, sigma)))))
            lengths.append(n)
            left -= n
        rows.append(lengths)
    return rows


def segment_ids_of(rows: list[list[int]]):
    """(B, T) int32 segment ids: document i of a row has id i."""
    return jnp.asarray(np.stack([np.repeat(np.arange(len(r)), r) for r in rows]),
                       jnp.int32)


def la_inputs(key, b, t, dtype=jnp.bfloat16, h=H, d=D):
    """Positive features (a feature map's output), normalised so sums stay O(1)."""
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.nn.softmax(jax.random.normal(kq, (b, t, h, d), jnp.float32), -1).astype(dtype)
    k = jax.nn.softmax(jax.random.normal(kk, (b, t, h, d), jnp.float32), -1).astype(dtype)
    v = jax.random.normal(kv, (b, t, h, d), jnp.float32).astype(dtype)
    return q, k, v


# ----------------------------------------------------------------------------- our ops

def gdn_fn(impl, tuning: Tuning = DEFAULT_TUNING, chunk: int = CHUNK, segment_ids=None):
    """The GDN forward of impl: "pallas" at tuning, "pallas-xlaprep" (Pallas recurrence,
    XLA chunk preparation), "pallas-bv64" (tuning with 64 value columns per sequential
    program), or a kernels.ops impl ("chunk", ...); segment_ids: packed documents (the
    "pallas" and ops impls)."""
    def f(q, k, v, g, beta):
        if impl == "pallas":
            return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, tuning=tuning,
                                       segment_ids=segment_ids)
        if impl == "pallas-xlaprep":
            return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, fused_prep=False,
                                       tuning=tuning)
        if impl == "pallas-bv64":
            return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk,
                                       tuning=dataclasses.replace(tuning, block_v=64))
        return ops.gated_delta_rule(q, k, v, g, beta, impl=impl, chunk_size=chunk,
                                    segment_ids=segment_ids)
    return f


def la_fn(impl, tuning: Tuning = DEFAULT_TUNING, chunk: int = CHUNK, segment_ids=None):
    """The normalised linear-attention forward of impl: "pallas" at tuning, or a
    kernels.ops impl; segment_ids: packed documents."""
    def f(q, k, v):
        if impl == "pallas":
            return kp.linear_attention(q, k, v, normalize=True, chunk_size=chunk,
                                       tuning=tuning, segment_ids=segment_ids)
        return ops.linear_attention(q, k, v, normalize=True, impl=impl, chunk_size=chunk,
                                    segment_ids=segment_ids)
    return f


def cudnn_fn(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", is_causal=True)


def fwd_bwd(f, ndiff):
    """jit of f's outputs and its VJP w.r.t. its first ndiff arguments with a fixed
    cotangent: a training step's work. (Returning the outputs matters: without them XLA
    drops whatever computes only O, e.g. the split forward's output pass, and the time
    would not be what a model pays.)"""
    def run(*args):
        out, pull = jax.vjp(lambda *d: f(*d, *args[ndiff:-1]), *args[:ndiff])
        return out, pull(args[-1])
    return jax.jit(run)


def breakdown(q, k, v, g, beta, tuning: Tuning, chunk: int):
    """Where the GDN forward goes: the chunk preparation (the two Pallas kernels vs XLA)
    alone."""
    from kernels.pallas import gdn, prep
    from kernels.pallas.gdn_prep import gdn_prep

    def prep_pallas(q, k, v, g, beta):
        return gdn_prep(q, k, v, prep.in_chunk_cumsum(g, chunk), beta, chunk=chunk,
                        tuning=tuning, with_inverse=False)
    for name, fn in (("prep_pallas", prep_pallas),
                     ("prep_xla", lambda *a: gdn.prep_xla(*a, chunk))):
        s = time_jax(jax.jit(fn), q, k, v, g, beta)
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


def fla_gdn_inputs(torch, b, t, h=H, d=D):
    """fla's gated-delta-rule inputs on the GPU, as gdn_inputs makes ours: unit q and k,
    bf16 q k v, float32 log-decays (logsigmoid) and beta in (0.5, 0.73)."""
    dev = "cuda"
    unit = lambda x: torch.nn.functional.normalize(x, dim=-1).bfloat16()  # noqa: E731
    q = unit(torch.randn(b, t, h, d, device=dev))
    k = unit(torch.randn(b, t, h, d, device=dev))
    v = torch.randn(b, t, h, d, device=dev).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, device=dev)).float()
    beta = torch.rand(b, t, h, device=dev).sigmoid().float()
    return q, k, v, g, beta


def fla_rows(torch, fops, b, t, graph=False, h=H, d=D):
    out = {}
    dev = "cuda"
    q, k, v, g, beta = fla_gdn_inputs(torch, b, t, h, d)
    with torch.no_grad():
        out["gdn"] = time_torch(lambda: fops.chunk_gated_delta_rule(q, k, v, g, beta),
                                graph)
        qa, ka = (torch.softmax(torch.randn(b, t, h, d, device=dev), -1).bfloat16()
                  for _ in range(2))
        out["linear"] = time_torch(
            lambda: fops.chunk_linear_attn(qa, ka, v, normalize=True), graph)
    return out


def fla_varlen(torch, fops, rows, h=H, d=D, graph=False):
    """fla's chunk_gated_delta_rule forward over packed documents: every row's documents
    as one (1, B*T) sequence with cu_seqlens at each document's start (fla's varlen
    interface)."""
    total = sum(map(sum, rows))
    q, k, v, g, beta = fla_gdn_inputs(torch, 1, total, h, d)
    starts = np.concatenate([[0], np.cumsum([n for r in rows for n in r])])
    cu = torch.tensor(starts, dtype=torch.long, device="cuda")
    with torch.no_grad():
        return time_torch(lambda: fops.chunk_gated_delta_rule(q, k, v, g, beta,
                                                              cu_seqlens=cu), graph)


def fla_decode(torch, fops, h=H, d=D):
    q, k, v, g, beta = fla_gdn_inputs(torch, DECODE_B, 1, h, d)
    s = torch.randn(DECODE_B, h, d, d, device="cuda").float()
    with torch.no_grad():
        return time_torch(lambda: fops.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta=beta, initial_state=s, output_final_state=True))


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out",
                    default=str(pathlib.Path(__file__).resolve().parents[1] / "docs"))
    ap.add_argument("--shapes", default="8x2048,2x8192,1x32768")
    ap.add_argument("--skip", default="",
                    help=f"comma list of row groups to skip ({', '.join(SKIPPABLE)})")
    ap.add_argument("--packed", default="2x8192,1x32768",
                    help="BxT rows of packed documents (log-normal lengths, mean "
                         f"{PACKED_MEAN}) for rows 'pallas-packed' and fla's varlen "
                         "forward 'fla-varlen' ('' for none)")
    ap.add_argument("--chunk-shapes", default="",
                    help="time the pure-JAX chunk forms only at these shapes "
                         "(default: all)")
    ap.add_argument("--xlaprep", action="store_true",
                    help="also time GDN with the XLA chunk preparation, and a breakdown")
    ap.add_argument("--tuning", default="", metavar="KEY=VALUE,...",
                    help="the Pallas rows' kernels.pallas.Tuning: DEFAULT_TUNING with "
                         "these fields replaced (e.g. seq_stages=2,block_v=none)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                    help="also time the Pallas ops at the run's Tuning with these fields "
                         "replaced, as rows 'pallas-NAME' (repeatable)")
    ap.add_argument("--chunk", type=int, default=CHUNK,
                    help=f"chunk size of our chunkwise ops ({CHUNK})")
    ap.add_argument("--chunks", default="",
                    help="comma list of other chunk sizes to time beside --chunk (rows "
                         "'pallas-cN')")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="skip the remaining timings after this many seconds (files are "
                         "still written)")
    ap.add_argument("--heads", type=int, default=H,
                    help="heads (16; smaller for smoke tests)")
    ap.add_argument("--dim", type=int, default=D, help="head dim (128)")
    ap.add_argument("--from-log", nargs="+", metavar="LOG[@COMMIT]",
                    help="rebuild the outputs from the printed logs of earlier runs (one "
                         "run each; ratios only within a run) instead of measuring")
    args = ap.parse_args(argv)
    args.skip = set(filter(None, args.skip.split(",")))
    if args.skip - set(SKIPPABLE):
        ap.error(f"--skip {','.join(sorted(args.skip - set(SKIPPABLE)))}: no such rows "
                 f"(choices: {', '.join(SKIPPABLE)})")
    try:
        args.tuning = parse_tuning(args.tuning)
        # (row name, Tuning, chunk size) of each side-by-side row group
        args.side_rows = [(*parse_variant(spec, args.tuning), args.chunk)
                          for spec in args.variant]
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    args.side_rows += [(f"pallas-c{c}", args.tuning, c)
                       for c in (int(x) for x in args.chunks.split(",") if x)
                       if c != args.chunk]
    names = [name for name, _, _ in args.side_rows]
    if len(set(names)) < len(names):
        ap.error(f"--variant / --chunks: row names repeat ({', '.join(names)})")
    return args


def main(argv=None):
    args = parse_args(argv)
    h, d = args.heads, args.dim
    if args.from_log:
        runs = [parse_log(*(spec.split("@", 1) + [None])[:2], run=i + 1, h=h, d=d)
                for i, spec in enumerate(args.from_log)]
        write_outputs(pathlib.Path(args.out), runs)
        print(markdown(runs))
        return
    tuning, chunk, skip = args.tuning, args.chunk, args.skip
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    chunk_shapes = ({tuple(int(x) for x in s.split("x"))
                     for s in args.chunk_shapes.split(",")}
                    if args.chunk_shapes else set(shapes))
    start = time.perf_counter()
    dev = jax.devices()[0]
    device = getattr(dev, "device_kind", str(dev))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print(f"# device {device}, jax {jax.__version__}, {date}")
    print("# command python scripts/bench_kernels.py " + " ".join(sys.argv[1:]))
    records, notes = [], []

    def record(op, impl, pss, b, t, seconds, floor_bytes, extra=None):
        rec = {"op": op, "impl": impl, "pass": pss, "B": b, "T": t, "H": h, "D": d,
               "ms": round(seconds * 1e3, 4), "device": device, "jax": jax.__version__,
               "date": date, "floor_ms": round(floor_bytes / bw * 1e3, 4)}
        if extra:
            rec.update(extra)
        records.append(rec)
        flush()
        print(f"{op:8s} {impl:16s} {pss:8s} B{b:<2d} T{t:<6d} {seconds * 1e3:9.3f} ms "
              f"{b * t / seconds / 1e6:9.2f} Mtok/s  floor {rec['floor_ms']:.3f} ms",
              flush=True)

    settings = run_settings(tuning, chunk)
    print(f"# kernel settings {settings}")
    # each side row group's settings where they differ from the run's
    variants = {name: {k: v for k, v in run_settings(t_, c).items() if settings[k] != v}
                for name, t_, c in args.side_rows}
    for name, st in variants.items():
        print(f"# variant {name} settings {st}")
    run_meta = {"run": 1, "commit": git_commit(), "settings": settings,
                "copy_bandwidth_TBps": None,
                "peak_memory": {}, "accuracy_rel_rms": {}, "failures": notes,
                "command": "python scripts/bench_kernels.py " + " ".join(sys.argv[1:]),
                "records": records}
    if variants:
        run_meta["variants"] = variants

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
                xs = gdn_inputs(key, bmax, tmax, h=h, d=d)
                f = fwd_bwd(gdn_fn("pallas", tuning, chunk), 5)
            else:
                xs = la_inputs(key, bmax, tmax, h=h, d=d)
                f = fwd_bwd(la_fn("pallas", tuning, chunk), 3)
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
    qd, kd_, vd, gd, bd, sd = decode_inputs(h=h, d=d)
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
        s = attempt("fla decode", lambda: fla_decode(torch, fops, h, d))
        if s:
            record("gdn", "fla-fused-recurrent", "decode", DECODE_B, 1, s, dec_bytes)

    for b, t in shapes:
        n_tok = b * t * h * d
        fwd_bytes = 4 * n_tok * 2            # q, k, v read, o written (bf16)
        fb_bytes = 11 * n_tok * 2            # + do, q, k, v read; dq, dk, dv written
        key = jax.random.PRNGKey(b * t)
        q, k, v, g, beta = gdn_inputs(key, b, t, h=h, d=d)
        qa, ka, va = la_inputs(jax.random.fold_in(key, 1), b, t, h=h, d=d)
        do = jax.random.normal(jax.random.fold_in(key, 2), v.shape,
                               jnp.float32).astype(v.dtype)

        def time_side_rows(name, tuning_, chunk_):
            """Rows `name`: both Pallas ops, fwd and fwd+bwd, at tuning_ and chunk_,
            beside the run's own."""
            for op, pss in (("gdn", "fwd"), ("gdn", "fwd+bwd"), ("linear", "fwd"),
                            ("linear", "fwd+bwd")):
                fn, xs = ((gdn_fn, (q, k, v, g, beta)) if op == "gdn"
                          else (la_fn, (qa, ka, va)))
                f = fn("pallas", tuning_, chunk_)
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
            gdn_f, la_f = gdn_fn(impl, tuning, chunk), la_fn(impl, tuning, chunk)
            attempt(f"gdn {impl} fwd {b}x{t}", lambda: record(
                "gdn", impl, "fwd", b, t, time_jax(jax.jit(gdn_f), q, k, v, g, beta),
                fwd_bytes))
            attempt(f"gdn {impl} fwd+bwd {b}x{t}", lambda: record(
                "gdn", impl, "fwd+bwd", b, t,
                time_jax(fwd_bwd(gdn_f, 5), q, k, v, g, beta, do), fb_bytes))
            for name, tuning_, chunk_ in (args.side_rows if impl == "pallas" else []):
                time_side_rows(name, tuning_, chunk_)
            if impl == "pallas-xlaprep":
                if b * t == 16384 and t == 8192:
                    attempt("breakdown", lambda: breakdown(q, k, v, g, beta, tuning, chunk))
                continue
            attempt(f"linear {impl} fwd {b}x{t}", lambda: record(
                "linear", impl, "fwd", b, t, time_jax(jax.jit(la_f), qa, ka, va),
                fwd_bytes))
            attempt(f"linear {impl} fwd+bwd {b}x{t}", lambda: record(
                "linear", impl, "fwd+bwd", b, t,
                time_jax(fwd_bwd(la_f, 3), qa, ka, va, do), fb_bytes))
        if b * h < 64 and "bv64" not in skip:   # where the adaptive split differs
            attempt(f"gdn pallas-bv64 fwd {b}x{t}", lambda: record(
                "gdn", "pallas-bv64", "fwd", b, t,
                time_jax(jax.jit(gdn_fn("pallas-bv64", tuning, chunk)), q, k, v, g, beta),
                fwd_bytes))
        if "cudnn" not in skip:
            attempt(f"cudnn fwd {b}x{t}", lambda: record(
                "softmax", "cudnn", "fwd", b, t, time_jax(jax.jit(cudnn_fn), q, k, v),
                fwd_bytes))
            attempt(f"cudnn fwd+bwd {b}x{t}", lambda: record(
                "softmax", "cudnn", "fwd+bwd", b, t,
                time_jax(fwd_bwd(cudnn_fn, 3), q, k, v, do), fb_bytes))
        if fops is not None:
            res = attempt(f"fla {b}x{t}", lambda: fla_rows(torch, fops, b, t, h=h, d=d))
            for op, s in (res or {}).items():
                record(op, "fla", "fwd", b, t, s, fwd_bytes)
            if "flagraph" not in skip:   # fla's device time alone (not the anchor)
                res = attempt(f"fla-graph {b}x{t}",
                              lambda: fla_rows(torch, fops, b, t, graph=True, h=h, d=d))
                for op, s in (res or {}).items():
                    record(op, "fla-graph", "fwd", b, t, s, fwd_bytes)

        # accuracy: bf16 Pallas against the float32 chunk form on the same inputs
        def acc():
            f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
            gdn_ref, gdn_got = gdn_fn("chunk", chunk=chunk), gdn_fn("pallas", tuning, chunk)
            ref = jax.jit(gdn_ref)(f32(q), f32(k), f32(v), g, beta)
            got = jax.jit(gdn_got)(q, k, v, g, beta)
            # the gradients (fwd_bwd also returns the outputs)
            gref = fwd_bwd(gdn_ref, 3)(f32(q), f32(k), f32(v), g, beta, f32(do))[1]
            ggot = fwd_bwd(gdn_got, 3)(q, k, v, g, beta, do)[1]
            la_ref = jax.jit(la_fn("chunk", chunk=chunk))(f32(qa), f32(ka), f32(va))
            la_got = jax.jit(la_fn("pallas", tuning, chunk))(qa, ka, va)
            c = {"gdn_o": rel_rms(got, ref), "linear_o": rel_rms(la_got, la_ref)}
            for name, a_, r_ in zip(("gdn_dq", "gdn_dk", "gdn_dv"), ggot, gref):
                c[name] = rel_rms(a_, r_)
            checks[f"{b}x{t}"] = c
            print(f"# rel RMS error bf16 pallas vs f32 chunk {b}x{t}: "
                  + ", ".join(f"{n} {x:.2e}" for n, x in c.items()), flush=True)
        if (b, t) in chunk_shapes and b * t <= 16384:   # also with the chunk rows skipped
            attempt(f"accuracy {b}x{t}", acc)

    packed = [] if "packed" in skip or not args.packed else [
        tuple(int(x) for x in s.split("x")) for s in args.packed.split(",")]
    for b, t in packed:
        time_packed(b, t, tuning, chunk, h, d, record, attempt, checks, torch, fops)

    write_outputs(pathlib.Path(args.out), [run_meta])
    print(markdown([run_meta]))


def time_packed(b, t, tuning, chunk, h, d, record, attempt, checks, torch, fops):
    """Rows of packed documents: our kernels with segment_ids ("pallas-packed": GDN and
    linear attention, fwd and fwd+bwd), fla's varlen GDN forward (the anchor), and the
    bf16 error of the packed GDN forward against the float32 chunk form."""
    rows = packed_lengths(b * t, b, t)
    seg = segment_ids_of(rows)
    docs = sum(map(len, rows))
    print(f"# packed B{b} T{t}: {docs} documents, mean length {b * t / docs:.0f}",
          flush=True)
    n_tok = b * t * h * d
    fwd_bytes, fb_bytes = 4 * n_tok * 2, 11 * n_tok * 2
    key = jax.random.PRNGKey(b * t + 1)
    q, k, v, g, beta = gdn_inputs(key, b, t, h=h, d=d)
    qa, ka, va = la_inputs(jax.random.fold_in(key, 1), b, t, h=h, d=d)
    do = jax.random.normal(jax.random.fold_in(key, 2), v.shape, jnp.float32).astype(v.dtype)
    gdn_f = gdn_fn("pallas", tuning, chunk, seg)
    la_f = la_fn("pallas", tuning, chunk, seg)
    for op, f, xs in (("gdn", gdn_f, (q, k, v, g, beta)), ("linear", la_f, (qa, ka, va))):
        attempt(f"{op} pallas-packed fwd {b}x{t}", lambda: record(
            op, "pallas-packed", "fwd", b, t, time_jax(jax.jit(f), *xs), fwd_bytes))
        attempt(f"{op} pallas-packed fwd+bwd {b}x{t}", lambda: record(
            op, "pallas-packed", "fwd+bwd", b, t,
            time_jax(fwd_bwd(f, len(xs)), *xs, do), fb_bytes))
    if fops is not None:
        s = attempt(f"fla-varlen {b}x{t}", lambda: fla_varlen(torch, fops, rows, h, d))
        if s:
            record("gdn", "fla-varlen", "fwd", b, t, s, fwd_bytes)

    def acc():
        f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
        ref = jax.jit(gdn_fn("chunk", chunk=chunk, segment_ids=seg))(
            f32(q), f32(k), f32(v), g, beta)
        got = jax.jit(gdn_f)(q, k, v, g, beta)
        checks[f"packed {b}x{t}"] = {"gdn_o": rel_rms(got, ref)}
        print(f"# rel RMS error bf16 pallas vs f32 chunk packed {b}x{t}: gdn_o "
              f"{checks[f'packed {b}x{t}']['gdn_o']:.2e}", flush=True)
    if b * t <= 16384:
        attempt(f"accuracy packed {b}x{t}", acc)


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
    """ratio_to_anchor: fla forward for "fwd" (its varlen forward for packed rows), cuDNN
    for "fwd+bwd", fla fused recurrent for "decode", taken from the same run only."""
    for rec in records:
        fla = "fla-varlen" if rec["impl"].endswith("packed") else "fla"
        want = {"fwd": (fla, rec["op"]), "fwd+bwd": ("cudnn", "softmax"),
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


def parse_log(path, commit=None, run=None, h=H, d=D):
    """One run's printed output -> the run's meta and records (what a live run writes);
    h, d: the run's heads and head dim, which its rows do not print."""
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
                                    "T": int(t), "H": h, "D": d, "ms": float(ms),
                                    "device": device, "jax": jax_version, "date": date,
                                    "floor_ms": float(floor)})
    return meta


def markdown(runs):
    """One table per run (ratios are only taken within a run: the machines are shared and
    noisy, so anchors are re-measured side by side)."""
    lines = ["# Kernel benchmarks", "",
             "Made by scripts/bench_kernels.py from docs/benchmarks.json. bf16 inputs, "
             "float32 state, H16 D128, chunk 64 unless the run's settings or the impl "
             "(pallas-cN) say otherwise; median ms of device-synchronised runs after "
             "warm-up.",
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
                  + (f" Kernel settings: {meta['settings']}." if meta.get("settings")
                     else "")
                  + (f" Side-by-side rows differ in: {meta['variants']}."
                     if meta.get("variants") else ""),
                  "", "| op | impl | pass | B | T | ms | Mtok/s | floor ms | x anchor |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(recs, key=lambda r: (r["pass"], r["T"], r["op"], r["impl"])):
            tok = r["B"] * r["T"] / (r["ms"] / 1e3) / 1e6
            ratio = ("" if r.get("ratio_to_anchor") is None
                     else f"{r['ratio_to_anchor']:.2f}")
            lines.append(f"| {r['op']} | {r['impl']} | {r['pass']} | {r['B']} | {r['T']} | "
                         f"{r['ms']:.3f} | {tok:.1f} | {r['floor_ms']:.3f} | {ratio} |")
        if meta["peak_memory"]:
            lines += ["", "Peak memory of fwd+bwd at the longest shape:", ""]
            for op, p in meta["peak_memory"].items():
                temp = p.get("compiled_temp_bytes")
                lines.append(
                    f"- {op}: process peak {p['peak_bytes'] / 2**30:.2f} GiB"
                    + ("" if temp is None else
                       f", the compiled fwd+bwd program's temporaries "
                       f"{temp / 2**30:.2f} GiB")
                    + f" (inputs + cotangent {p['inputs_bytes'] / 2**30:.2f} GiB)")
        if meta["accuracy_rel_rms"]:
            lines += ["", "Relative RMS error, bf16 Pallas against the float32 form:", ""]
            for shape, c in meta["accuracy_rel_rms"].items():
                lines.append(f"- {shape}: "
                             + ", ".join(f"{k} {v:.2e}" for k, v in c.items()))
        if meta["failures"]:
            lines += ["", "Rows that failed or were skipped:", ""]
            lines += [f"- {f}" for f in meta["failures"]]
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
