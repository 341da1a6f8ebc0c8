"""The benchmark and profiling scripts' own logic (not their timings): anchors are taken
from the same run and shape only, the profile sums device events per kernel name,
ignoring host events, and the Tuning a command line names is the one the kernels get."""
import dataclasses
import gzip
import json
import re

import pytest

import kernels.pallas as kp
import scripts.bench_kernels as bk
import scripts.profile_kernels as pk


def _rec(op, impl, pss, b, t, ms):
    return {"op": op, "impl": impl, "pass": pss, "B": b, "T": t, "ms": ms}


def test_ratios_use_the_anchor_of_the_same_pass_and_shape():
    recs = [_rec("gdn", "fla", "fwd", 8, 2048, 0.5),
            _rec("gdn", "pallas", "fwd", 8, 2048, 0.4),
            _rec("gdn", "pallas", "fwd", 2, 8192, 0.8),        # no fla row at this shape
            _rec("softmax", "cudnn", "fwd+bwd", 8, 2048, 2.0),
            _rec("gdn", "pallas", "fwd+bwd", 8, 2048, 1.0),
            _rec("linear", "pallas", "fwd", 8, 2048, 0.3),     # its anchor is fla linear
            _rec("linear", "fla", "fwd", 8, 2048, 0.6)]
    bk.add_ratios(recs)
    ratio = {(r["op"], r["impl"], r["pass"], r["T"]): r["ratio_to_anchor"] for r in recs}
    assert ratio[("gdn", "pallas", "fwd", 2048)] == pytest.approx(0.8)
    assert ratio[("gdn", "pallas", "fwd", 8192)] is None
    assert ratio[("gdn", "pallas", "fwd+bwd", 2048)] == pytest.approx(0.5)
    assert ratio[("linear", "pallas", "fwd", 2048)] == pytest.approx(0.5)
    assert ratio[("gdn", "fla", "fwd", 2048)] == pytest.approx(1.0)


def test_profile_sums_device_events_by_kernel_name(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "X", "name": "linear_chunk_fwd", "pid": 1, "tid": 7, "dur": 300.0},
        {"ph": "X", "name": "linear_chunk_fwd", "pid": 1, "tid": 8, "dur": 100.0},
        {"ph": "X", "name": "gdn_chunk_prep", "pid": 1, "tid": 7, "dur": 50.0},
        {"ph": "X", "name": "PjitFunction", "pid": 2, "tid": 1, "dur": 9999.0},  # host
        {"ph": "i", "name": "marker", "pid": 1, "tid": 7},                   # not a span
    ]
    run = tmp_path / "plugins" / "profile" / "run1"
    run.mkdir(parents=True)
    with gzip.open(run / "host.trace.json.gz", "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    got, procs = pk.device_events(tmp_path)
    assert sorted(got) == [("gdn_chunk_prep", 50.0), ("linear_chunk_fwd", 100.0),
                           ("linear_chunk_fwd", 300.0)]
    assert procs == ["/device:GPU:0", "/host:CPU"]
    with pytest.raises(FileNotFoundError):
        pk.device_events(tmp_path / "plugins" / "profile" / "missing")


def test_fwd_bwd_returns_the_outputs_with_the_gradients():
    """The fwd+bwd timer must keep the forward's outputs live: without them XLA drops the
    work that only computes O (the split forward's output pass), which a model pays."""
    import jax.numpy as jnp
    x = jnp.arange(4.0)
    ct = jnp.ones(4)
    out, (dx,) = bk.fwd_bwd(lambda a: jnp.sin(a) * 2.0, 1)(x, ct)
    assert jnp.allclose(out, 2.0 * jnp.sin(x))
    assert jnp.allclose(dx, 2.0 * jnp.cos(x))


def test_a_tuning_string_replaces_the_fields_it_names():
    """--tuning key=value,...: DEFAULT_TUNING (or a base) with those fields replaced;
    tuning_spec writes every field back, or with a base only the ones that differ."""
    t = bk.parse_tuning("seq_stages=2, wu_warps=4,solve_precision=highest,block_v=32")
    assert t == dataclasses.replace(kp.DEFAULT_TUNING, seq_stages=2, wu_warps=4,
                                    solve_precision="highest", block_v=32)
    assert bk.parse_tuning("") == kp.DEFAULT_TUNING
    assert bk.parse_tuning("block_v=none", t) == dataclasses.replace(t, block_v=None)
    # every field: the same Tuning whatever it is read on
    assert bk.parse_tuning(bk.tuning_spec(t), kp.Tuning(grads_warps=2)) == t
    assert (bk.tuning_spec(t, kp.DEFAULT_TUNING)
            == "seq_stages=2,block_v=32,wu_warps=4,solve_precision=highest")
    assert bk.tuning_spec(kp.DEFAULT_TUNING, kp.DEFAULT_TUNING) == ""
    for bad in ("seq_stage=2", "seq_stages", "seq_stages=0", "solve_precision=low",
                "seq_warps=x", "block_v=0"):
        with pytest.raises(ValueError):
            bk.parse_tuning(bad)


def test_the_command_line_sets_the_runs_tuning_and_its_side_by_side_rows():
    """The Pallas rows run at --tuning; each --variant is that Tuning with its own fields
    replaced, each --chunks size that Tuning at another chunk; names of deleted rows and
    fields are refused rather than ignored."""
    args = bk.parse_args(["--tuning", "seq_stages=2", "--variant", "w4:wu_warps=4",
                          "--chunks", "32,64"])
    base = dataclasses.replace(kp.DEFAULT_TUNING, seq_stages=2)
    assert (args.tuning, args.chunk) == (base, bk.CHUNK)
    assert args.side_rows == [("pallas-w4", dataclasses.replace(base, wu_warps=4), 64),
                              ("pallas-c32", base, 32)]
    assert bk.parse_args([]).tuning == kp.DEFAULT_TUNING
    for argv in (["--skip", "xbwd"], ["--segments", "8"], ["--variant", "w4"],
                 ["--variant", "c32:wu_warps=4", "--chunks", "32"],
                 ["--tuning", "prep_kernels=3"]):
        with pytest.raises(SystemExit):
            bk.parse_args(argv)


def test_a_run_records_every_setting_it_was_timed_with():
    """bench_kernels.run_settings: every field of the run's Tuning (so a Tuning sourced
    from best_seq.tuning shows in the run's record) and the chunk size."""
    t = dataclasses.replace(kp.DEFAULT_TUNING, solve_precision="highest",
                            kkt_solve_warps=2)
    got = bk.run_settings(t, 32)
    assert set(got) == {f.name for f in dataclasses.fields(kp.Tuning)} | {"chunk"}
    assert (got["solve_precision"], got["kkt_solve_warps"], got["chunk"]) == ("highest", 2,
                                                                              32)
    assert got["min_block_v"] == kp.DEFAULT_TUNING.min_block_v
    meta = {"run": 1, "commit": "abc", "command": "c", "copy_bandwidth_TBps": 3.0,
            "settings": got, "peak_memory": {}, "accuracy_rel_rms": {}, "failures": [],
            "records": [{**_rec("gdn", "pallas", "fwd", 8, 2048, 0.4), "floor_ms": 0.08}]}
    text = bk.markdown([meta])
    assert f"Kernel settings: {got}." in text
    assert "| gdn | pallas | fwd | 8 | 2048 | 0.400 | 41.0 | 0.080 |  |" in text


@pytest.mark.parametrize("which", ["seq", "prep", "warps"])
def test_tune_picks_the_fastest_tuning_and_writes_it_as_a_tuning_string(which, tmp_path,
                                                                         monkeypatch):
    """tune_sequential times each Tuning of tune_settings (here: fake timers that read
    the Tuning they are given) and writes the one with the least summed time as the
    --tuning string that selects it; each setting is the base with one field changed."""
    base = dataclasses.replace(kp.DEFAULT_TUNING, grads_warps=4)
    settings, _ = pk.tune_settings(which, base)
    assert settings[0] == base and len(set(settings)) == len(settings) > 1
    assert all(len(bk.tuning_spec(st, base).split(",")) == 1 for st in settings[1:])
    target = settings[-1]          # make the last setting the fastest
    names = [f.name for f in dataclasses.fields(kp.Tuning)]

    def fake(b, t, tuning):
        changed = sum(getattr(tuning, n) != getattr(target, n) for n in names)
        return 1e-3 * (1 + changed) * t / 2048

    monkeypatch.setattr(pk, "time_gdn_fwd", fake)
    monkeypatch.setattr(pk, "time_gdn_fwdbwd", fake)
    assert pk.tune_sequential(str(tmp_path), which, base=base) == target
    spec = (tmp_path / "best_seq.tuning").read_text().strip()
    assert bk.parse_tuning(spec) == target
    rows = json.loads((tmp_path / "seq.json").read_text())
    assert [kp.Tuning(**{n: r[n] for n in names}) for r in rows] == settings


def test_tune_settings_leave_out_a_change_the_base_already_has():
    base = dataclasses.replace(kp.DEFAULT_TUNING, seq_stages=2)
    settings, _ = pk.tune_settings("seq", base)
    assert settings[0] == base and len(set(settings)) == len(settings)
    assert len(settings) == len(pk.tune_settings("seq")[0]) - 1


def test_the_benchmarked_functions_pass_their_tuning_to_the_kernels(monkeypatch):
    """gdn_fn / la_fn under fwd_bwd (the benchmark's and the profile's timed programs)
    lower, for the GPU, to kernels launched with the Tuning they were given: the warps of
    the preparation, its backward and the gradient kernel, and (pallas-bv64) 64 value
    columns a program: 2 value blocks at V = 128 where the adaptive split, to fill the
    SMs at B1 H2, takes 8 of 16 columns."""
    import jax
    import jax.numpy as jnp
    from kernels.pallas import common
    monkeypatch.setattr(common, "interpret", lambda: False)   # the compiled path

    def launches(f, *xs):
        """{kernel name: (warps, grid)} of every Triton call f lowers to."""
        text = jax.jit(f).trace(*xs).lower(lowering_platforms=("cuda",)).as_text()
        calls = re.findall(r'grid_x = (\d+) : i32, grid_y = (\d+) : i32, grid_z = (\d+) '
                           r': i32, ir = "[^"]*", name = "(\w+)", num_stages = \d+ : i32, '
                           r'num_warps = (\d+)', text)
        assert calls
        return {name: (int(warps), tuple(map(int, grid))) for *grid, name, warps in calls}

    x = jnp.ones((1, 64, 2, 128), jnp.bfloat16)
    g = jnp.full((1, 64, 2), -0.1)
    t = dataclasses.replace(kp.DEFAULT_TUNING, wu_warps=2, prep_bwd_warps=2, grads_warps=2)
    got = launches(bk.fwd_bwd(bk.gdn_fn("pallas", t, 32), 5), x, x, x, g, g, x)
    assert {got[n][0] for n in ("gdn_chunk_prep_wu", "gdn_chunk_prep_bwd",
                                "linear_chunk_bwd_grads")} == {2}
    default = launches(bk.fwd_bwd(bk.gdn_fn("pallas", chunk=32), 5), x, x, x, g, g, x)
    assert default["gdn_chunk_prep_wu"][0] == kp.DEFAULT_TUNING.wu_warps
    la = launches(bk.fwd_bwd(bk.la_fn("pallas", t, 32), 3), x, x, x, x)
    assert la["linear_chunk_bwd_grads"][0] == 2
    fwd = {name: launches(jax.jit(bk.gdn_fn(name, chunk=32)), x, x, x, g, g)
           for name in ("pallas", "pallas-bv64")}
    grids = [fwd[name]["linear_chunk_fwd"][1] for name in ("pallas", "pallas-bv64")]
    assert grids[0][:2] == grids[1][:2] and grids[0][2] == 4 * grids[1][2] == 8
