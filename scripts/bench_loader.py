"""Packed rows per second of the token-store loader alone (data.source=store).

    python scripts/bench_loader.py --out DIR [--store PATH] [--mb 256] [--seq_len 2048]
        [--batch_size 16] [--steps 200]

Without --store, DIR/corpus (--mb megabytes of generated text in 64 files of
paragraphs) is prepared into DIR/store first (byte tokenizer; the preparation's own
rate is reported too). Each row then builds the dataset and times `batch(step)` for
steps 0 .. steps-1 after one warm-up batch, for each packing and prefetch depth (and
process 0 of 2 reading its half of each batch with `batch_rows`, as the training feed does
on two processes); the
store's pages are in the page cache after the first pass (as they are for a store that
fits in RAM; a store past RAM adds the disk's read rate). Prints a table and writes
DIR/bench_loader.json, with the process's resident memory after each row (VmRSS and
its file-backed part; the peak VmHWM includes the preparation). The issue's target: >= 2M tokens/s at T = 2,048 on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import data  # noqa: E402
from data import prepare as prep  # noqa: E402


def write_corpus(directory: pathlib.Path, megabytes: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = [w for w in (ROOT / "README.md").read_text().split() if w.isalpha()][:2000]
    directory.mkdir(parents=True, exist_ok=True)
    per_file = megabytes * (1 << 20) // 64
    for f in range(64):
        path = directory / f"part_{f:02d}.txt"
        if path.exists() and path.stat().st_size >= per_file:
            continue
        out, size = [], 0
        while size < per_file:
            para = " ".join(rng.choices(words, k=rng.randint(20, 400)))
            out.append(para)
            size += len(para) + 2
        path.write_text("\n\n".join(out))


def resident_mib() -> dict:
    """This process's resident memory now (VmRSS) and the part of it that is file pages
    (RssFile: what memory maps of the store would add), in MiB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "RssFile", "VmHWM")}


def time_loader(store: str, packing: str, prefetch: int, seq_len: int, batch_size: int,
                steps: int, processes: int = 1) -> dict:
    """`processes` > 1: what process 0 of that many reads, its rows of each global batch
    (`batch_rows`, as the training loop's feed asks on several processes); the rates
    count the rows it reads."""
    ds = data.build({"source": "store", "store": store, "seq_len": seq_len,
                     "packing": packing, "prefetch": prefetch, "verify_store": False}, seed=0)
    share = None if processes == 1 else list(range(batch_size // processes))
    ds.batch_rows(0, batch_size, share)
    start = time.perf_counter()
    cpu0 = time.process_time()
    for step in range(1, steps + 1):
        ds.batch_rows(step, batch_size, share)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    if hasattr(ds, "close"):
        ds.close()
    rows = steps * (batch_size if share is None else len(share))
    return {"packing": packing, "prefetch": prefetch, "seq_len": seq_len,
            "processes": processes,
            "batch_size": batch_size, "steps": steps, "wall_s": wall,
            "rows_per_s": rows / wall, "tokens_per_s": rows * seq_len / wall,
            "cpu_s_per_wall_s": cpu / wall, "resident_mib": resident_mib()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--store", default=None)
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"cpu_count": os.cpu_count(), "rows": []}
    store = a.store
    if store is None:
        write_corpus(out / "corpus", a.mb)
        store = str(out / "store")
        start = time.perf_counter()
        m = prep.prepare(str(out / "corpus" / "*.txt"), store, sample_by="paragraph",
                         shard_tokens=1 << 25, progress=False)
        wall = time.perf_counter() - start
        result["prepare"] = {"megabytes": a.mb, "tokens": m["tokens"], "wall_s": wall,
                             "tokens_per_s": m["tokens"] / wall}
        print(f"prepare: {m['tokens']:,} tokens in {wall:.1f} s "
              f"({m['tokens'] / wall / 1e6:.1f}M tokens/s; a finished store is only checked)")
    print(f"{'packing':<16}{'prefetch':>9}{'share':>7}{'rows/s':>10}{'M tokens/s':>12}"
          f"{'cpu/wall':>10}{'RSS MiB':>9}{'file MiB':>9}")
    for packing, prefetch, processes in [(p, d, 1) for p in ("random_windows", "rows")
                                         for d in (0, 2)] + [("random_windows", 2, 2)]:
        r = time_loader(store, packing, prefetch, a.seq_len, a.batch_size, a.steps,
                        processes)
        result["rows"].append(r)
        share = "all" if processes == 1 else f"1/{processes}"
        print(f"{packing:<16}{prefetch:>9}{share:>7}{r['rows_per_s']:>10.0f}"
              f"{r['tokens_per_s'] / 1e6:>12.1f}{r['cpu_s_per_wall_s']:>10.2f}"
              f"{r['resident_mib']['VmRSS']:>9.0f}{r['resident_mib']['RssFile']:>9.0f}")
        (out / "bench_loader.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
