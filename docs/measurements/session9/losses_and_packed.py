"""Issue 15, third call: the first 200 losses of gated_deltanet through the Pallas kernels
and through the chunk form (two train.py processes at once: their speed is not measured),
then packed-row GDN forward 1x32768, ours vs fla's varlen, one process, anchor first."""
import concurrent.futures as cf
import json
import os
import pathlib
import sys

sys.path.insert(0, "scripts")
OUT = pathlib.Path(os.environ["OUT"])
os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.3"
import train_speed as ts  # noqa: E402

text = str(pathlib.Path(".jobs/input.txt").resolve())
gdn = ["--config.model.mixer=gated_deltanet"]
with cf.ThreadPoolExecutor(2) as pool:
    fp = pool.submit(ts.run_ours, "losses_pallas", ts.SHAKESPEARE, text, 200, 1, gdn,
                     pathlib.Path("/tmp/ts"))
    fc = pool.submit(ts.run_ours, "losses_chunk", ts.SHAKESPEARE, text, 200, 1,
                     gdn + ["--config.model.impl=chunk"], pathlib.Path("/tmp/ts"))
    pallas, chunk = fp.result(), fc.result()
gap = ts.loss_gap(pallas, chunk)
res = {"losses_pallas": pallas, "losses_chunk": chunk, "loss_gap": gap}
(OUT / "losses.json").write_text(json.dumps(res))
print("loss gap", gap, {k: v.get("failed", "")[-800:] for k, v in res.items()
                         if isinstance(v, dict) and "failed" in v}, flush=True)
print("first/last losses pallas", pallas.get("losses", [])[:2], pallas.get("losses", [])[-1:],
      "chunk", chunk.get("losses", [])[:2], chunk.get("losses", [])[-1:], flush=True)

os.environ.pop("XLA_PYTHON_CLIENT_MEM_FRACTION")
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
import jax  # noqa: E402
import bench_kernels as bk  # noqa: E402

b, t = 1, 32768
rows = bk.packed_lengths(b * t, b, t)
seg = bk.segment_ids_of(rows)
torch, fops = bk.fla_module()
fla_s = bk.fla_varlen(torch, fops, rows, bk.H, bk.D)
fq = bk.fla_gdn_inputs(torch, b, t, bk.H, bk.D)
with torch.no_grad():
    fla_unpacked = bk.time_torch(lambda: fops.chunk_gated_delta_rule(*fq))
q, k, v, g, beta = bk.gdn_inputs(jax.random.PRNGKey(b * t + 1), b, t)
ours = bk.time_jax(jax.jit(bk.gdn_fn("pallas", segment_ids=seg)), q, k, v, g, beta)
ours_unpacked = bk.time_jax(jax.jit(bk.gdn_fn("pallas")), q, k, v, g, beta)
line = {"docs": sum(map(len, rows)), "fla_varlen_ms": fla_s * 1e3,
        "pallas_packed_ms": ours * 1e3, "ratio": ours / fla_s,
        "fla_unpacked_ms": fla_unpacked * 1e3, "pallas_unpacked_ms": ours_unpacked * 1e3}
(OUT / "packed.json").write_text(json.dumps(line))
print("packed 1x32768", line, flush=True)
