"""The benchmark and profiling scripts' own logic (not their timings): anchors are taken
from the same run and shape only, and the profile sums device events per kernel name,
ignoring host events."""
import gzip
import json

import pytest

import scripts.bench_kernels as bk
import scripts.profile_kernels as pk


def _rec(op, impl, pss, b, t, ms):
    return {"op": op, "impl": impl, "pass": pss, "B": b, "T": t, "ms": ms}


def test_ratios_use_the_anchor_of_the_same_pass_and_shape():
    recs = [_rec("gdn", "fla", "fwd", 8, 2048, 0.5), _rec("gdn", "pallas", "fwd", 8, 2048, 0.4),
            _rec("gdn", "pallas", "fwd", 2, 8192, 0.8),              # no fla row at this shape
            _rec("softmax", "cudnn", "fwd+bwd", 8, 2048, 2.0),
            _rec("gdn", "pallas", "fwd+bwd", 8, 2048, 1.0),
            _rec("linear", "pallas", "fwd", 8, 2048, 0.3),           # linear's anchor is fla linear
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
        {"ph": "X", "name": "PjitFunction", "pid": 2, "tid": 1, "dur": 9999.0},   # host
        {"ph": "i", "name": "marker", "pid": 1, "tid": 7},                          # not a span
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


def test_with_setting_holds_a_switch_while_f_runs_and_restores_it():
    """The benchmark's side-by-side rows rely on this: the switch holds while f (and so
    the trace jit makes of it) runs, and is restored after, also when f raises."""
    import types

    mod = types.SimpleNamespace(SWITCH="default")
    seen = bk.with_setting(lambda x: (mod.SWITCH, x), mod, "SWITCH", "other")(3)
    assert seen == ("other", 3) and mod.SWITCH == "default"

    def boom():
        raise RuntimeError(mod.SWITCH)
    with pytest.raises(RuntimeError, match="other"):
        bk.with_setting(boom, mod, "SWITCH", "other")()
    assert mod.SWITCH == "default"


@pytest.mark.parametrize("which", ["seq", "prep", "warps"])
def test_tune_picks_the_fastest_setting_and_writes_it_as_environment(which, tmp_path,
                                                                     monkeypatch):
    """tune_sequential times each setting (here: fake timers that read the knobs the
    setting put in place), restores the defaults, and writes the setting with the least
    summed time as the environment variables that select it; each setting changes only
    knobs that SEQ_KNOBS names."""
    value = lambda key: getattr(*bk.knob(key))  # noqa: E731
    default = {key: value(key) for key in pk.SEQ_KNOBS}
    settings, _ = pk.tune_settings(which, default)
    assert all(set(st) == set(pk.SEQ_KNOBS) for st in settings)
    target = settings[-1]          # make the last setting the fastest

    def fake(b, t):
        changed = sum(value(key) != target[key] for key in default)
        return 1e-3 * (1 + changed) * t / 2048

    monkeypatch.setattr(pk, "time_gdn_fwd", fake)
    monkeypatch.setattr(pk, "time_gdn_fwdbwd", fake)
    best = pk.tune_sequential(str(tmp_path), which)
    assert {k: best[k] for k in pk.SEQ_KNOBS} == target
    assert {key: value(key) for key in default} == default     # defaults restored
    env = dict(item.split("=", 1) for item in
               (tmp_path / "best_seq.env").read_text().split()[1:])
    for key, (_, _, var) in pk.SEQ_KNOBS.items():
        assert env[var] == str(pk.env_value(target[key]))
    rows = json.loads((tmp_path / "seq.json").read_text())
    assert len(rows) == len(settings)


def test_a_run_records_every_knob_it_was_timed_with(monkeypatch):
    """bench_kernels.settings(): each knob's current value (so a setting sourced from
    best_seq.env shows in the run's record), seq_warps 0 as "auto", and MIN_BLOCK_V."""
    from kernels.pallas import intra, intra_split, recurrence
    monkeypatch.setattr(intra, "DIAG_INVERSE", "rows")
    monkeypatch.setattr(intra_split, "SOLVE_WARPS", 2)
    monkeypatch.setattr(recurrence, "SEQ_WARPS", 0)
    monkeypatch.setattr(bk, "CHUNK", 32)
    got = bk.settings()
    assert set(got) == set(bk.KNOBS) | {"min_block_v"}
    assert (got["diag_inverse"], got["solve_warps"], got["chunk"]) == ("rows", 2, 32)
    assert got["seq_warps"] == "auto"
    assert got["min_block_v"] == recurrence.MIN_BLOCK_V
    assert got["prep_kernels"] == intra.PREP_KERNELS


def test_fwd_bwd_holds_the_preparation_backward_through_the_gradient():
    """fwd_bwd(..., prep_bwd=X) has gdn.PREP_BWD = X while the backward is traced: the
    GDN gradient program has the Pallas preparation-backward kernel for "pallas" and not
    for "xla"; the setting is restored afterwards."""
    import jax
    import jax.numpy as jnp
    import kernels.pallas as kp
    from kernels.pallas import gdn
    from tests.kernels.jaxprs import equations

    def f(q, k, v, g, beta):
        return kp.gated_delta_rule(q, k, v, g, beta, chunk_size=16, variant="gpu")
    x = jnp.ones((1, 32, 2, 16), jnp.float32)
    g = jnp.full((1, 32, 2), -0.1)
    before = gdn.PREP_BWD
    names = {}
    for choice in ("xla", "pallas"):
        jaxpr = jax.make_jaxpr(bk.fwd_bwd(lambda *a: f(*a), 5, choice))(x, x, x, g, g, x)
        names[choice] = {str(e.params.get("name")) for e in equations(jaxpr.jaxpr)
                         if e.primitive.name == "pallas_call"}
        assert gdn.PREP_BWD == before
    assert "gdn_chunk_prep_bwd" in names["pallas"]
    assert "gdn_chunk_prep_bwd" not in names["xla"]
