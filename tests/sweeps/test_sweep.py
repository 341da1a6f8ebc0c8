"""sweeps on the tiny MQAR grid: outputs written, best lr right, reruns skip.

The sweep itself (two softmax runs, lr 1e-3 and 3e-2, a few steps each) is the
session fixture `mqar_sweep` in tests/sweeps/conftest.py.
"""
import json
import os
import time

import numpy as np
import pytest

from tests.eval.conftest import load_compare_config


def test_sweep_writes_results_and_markers(mqar_sweep):
    cfg, workdir, records, _ = mqar_sweep
    names = [r["run"] for r in records]
    assert names == ["T32_kv2__softmax__d16__lr0.001__s0",
                     "T32_kv2__softmax__d16__lr0.03__s0"]
    lines = [json.loads(x) for x in (workdir / "results.jsonl").read_text().splitlines()]
    assert [r["run"] for r in lines] == names
    for r in lines:
        assert os.path.isfile(workdir / r["run"] / "done.json")
        for key in ("task", "mixer", "d_model", "layers", "state_size", "params", "lr",
                    "seed", "steps", "metrics", "tokens_per_s", "wall_s"):
            assert key in r, key
        assert r["task"] == "mqar" and r["steps"] == 3 and r["d_model"] == 16
        assert r["layers"] == 1 and 0.0 <= r["metrics"]["accuracy"] <= 1.0
        # softmax's decode state at the training length: k and v per position per layer
        assert r["state_size"] == 32 * 2 * 16
    assert (workdir / "recall_vs_state.png").stat().st_size > 1000
    assert "## MQAR accuracy" in (workdir / "results.md").read_text()


def test_sweep_records_match_an_independent_evaluation(mqar_sweep):
    """The recorded accuracy is the masked argmax accuracy over the held-out batches."""
    import jax.numpy as jnp
    from flax import nnx

    from training.checkpoint import load_for_eval

    cfg, workdir, records, _ = mqar_sweep
    r = records[0]
    model, config, dataset, step = load_for_eval(str(workdir / r["run"]))
    hits = total = 0
    for b in dataset.eval_batches(cfg["eval"]["batch_size"], cfg["eval"]["num_batches"]):
        pred = np.asarray(nnx.jit(lambda m, x: m(x, deterministic=True))(
            model, jnp.asarray(b["inputs"]))).argmax(-1)
        m = b["mask"] > 0
        hits += int((pred == b["targets"])[m].sum())
        total += int(m.sum())
    assert r["metrics"]["queries"] == total
    assert r["metrics"]["accuracy"] == pytest.approx(hits / total, abs=1e-12)


def test_best_lr_in_table_is_the_best_record(mqar_sweep):
    from eval import report

    _, workdir, records, _ = mqar_sweep
    acc = {r["lr"]: r["metrics"]["accuracy"] for r in records}
    want = max(sorted(acc), key=lambda lr: acc[lr])  # ties: the smaller lr, as best_lr does
    best = report.best_lr(records)[("mqar", "T32_kv2", "softmax", "d16")]
    assert best["lr"] == want and best["value"] == acc[want]
    assert f"{acc[want]:.3f} (lr {want:g})" in (workdir / "results.md").read_text()


def test_second_invocation_skips_finished_runs(mqar_sweep):
    from sweeps import runner

    cfg, workdir, records, first_s = mqar_sweep
    before = {r["run"]: (os.path.getmtime(workdir / r["run"] / "done.json"),
                         os.path.getmtime(workdir / r["run"] / "metrics.jsonl"))
              for r in records}
    t0 = time.time()
    again = runner.sweep(cfg, str(workdir), only="softmax", progress=False)
    assert time.time() - t0 < first_s / 2  # only the tables and plots are rewritten
    assert [r["run"] for r in again] == list(before)
    for name, (done_t, metrics_t) in before.items():  # nothing trained or evaluated again
        assert os.path.getmtime(workdir / name / "done.json") == done_t
        assert os.path.getmtime(workdir / name / "metrics.jsonl") == metrics_t


def test_shards_split_the_grid_and_share_the_tables(mqar_sweep, tmp_path):
    """--shard=i/n runs grid entries i, i+n, ...; the tables cover every finished run."""
    import shutil

    from sweeps import grid, runner

    cfg, workdir, records, _ = mqar_sweep
    wd = tmp_path / "sharded"
    shutil.copytree(workdir, wd)
    first, second = (r["run"] for r in records)
    shutil.rmtree(wd / first)  # entry 0 unfinished, entry 1 finished
    done = runner.sweep(cfg, str(wd), only="softmax", shard="1/2", progress=False)
    assert [r["run"] for r in done] == [second] and not (wd / first).exists()
    done = runner.sweep(cfg, str(wd), only="softmax", shard="0/2", progress=False)
    assert [r["run"] for r in done] == [first, second]
    lines = (wd / "results.jsonl").read_text().splitlines()
    (wd / "results.jsonl").unlink()
    again = runner.sweep(cfg, str(wd), only="softmax", report_only=True, progress=False)
    assert [r["run"] for r in again] == [first, second]
    assert (wd / "results.jsonl").read_text().splitlines() == lines
    for bad in ("2/2", "1", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="shard"):
            grid.parse_shard(bad)


def test_report_only_merges_other_copies_and_keeps_lines_it_drops(mqar_sweep, tmp_path):
    """A directory holding only results.jsonl (copied without its run folders): rebuilding
    its tables saves the old file as results.previous.jsonl rather than losing it;
    --records puts those records back (grid order; a run's own record file wins)."""
    from sweeps import runner

    cfg, workdir, records, _ = mqar_sweep
    wd = tmp_path / "lines_only"
    wd.mkdir()
    first, second = (dict(r) for r in records)
    old_text = "".join(json.dumps(r) + "\n" for r in (second, first)) + "not json\n"
    (wd / "results.jsonl").write_text(old_text)
    assert runner.sweep(cfg, str(wd), only="softmax", report_only=True,
                        progress=False) == []
    assert (wd / "results.jsonl").read_text() == ""
    assert (wd / "results.previous.jsonl").read_text() == old_text

    other = tmp_path / "other_copy.jsonl"
    other.write_text(json.dumps(first) + "\n")
    merged = runner.sweep(cfg, str(wd), only="softmax", report_only=True, progress=False,
                          records_from=(str(wd / "results.previous.jsonl"), str(other)))
    assert merged == [first, second]
    assert [json.loads(x) for x in (wd / "results.jsonl").read_text().splitlines()] == merged
    assert "2 finished runs" in (wd / "results.md").read_text()

    newer = dict(second, metrics=dict(second["metrics"], accuracy=0.123456))
    (wd / second["run"]).mkdir()
    (wd / second["run"] / "done.json").write_text(json.dumps(newer))
    again = runner.sweep(cfg, str(wd), only="softmax", report_only=True, progress=False,
                         records_from=(str(other),))
    assert again == [first, newer]
    with pytest.raises(FileNotFoundError, match="no file"):
        runner.sweep(cfg, str(wd), report_only=True, progress=False,
                     records_from=(str(tmp_path / "absent.jsonl"),))


def test_records_outside_the_grid_are_named_and_join_when_the_grid_has_them(
        mqar_sweep, tmp_path, capsys):
    """--records' records of another seed are left out of the tables with one line
    naming the axis to widen; with that seed in the grid's seeds they are merged."""
    from sweeps import runner

    cfg, workdir, records, _ = mqar_sweep
    first = dict(records[0])
    assert first["run"].endswith(f"__s{first['seed']}")
    new_seed = dict(first, seed=5, run=first["run"].rsplit("__s", 1)[0] + "__s5")
    other = tmp_path / "new_seeds.jsonl"
    other.write_text(json.dumps(new_seed) + "\n")
    wd = tmp_path / "merge"
    capsys.readouterr()
    merged = runner.sweep(cfg, str(wd), only="softmax", report_only=True, progress=False,
                          records_from=(str(other),))
    assert merged == []
    err = capsys.readouterr().err
    assert ("1 of --records' records are of runs outside this grid" in err
            and new_seed["run"] in err and "seeds 5 (--config.seeds=...)" in err)
    wider = dict(cfg, seeds=tuple(cfg.get("seeds") or (0,)) + (5,))
    merged = runner.sweep(wider, str(wd), only="softmax", report_only=True,
                          progress=False, records_from=(str(other),))
    assert merged == [new_seed]
    assert "outside this grid" not in capsys.readouterr().err


def test_publish_collects_a_sweep_whose_results_end_in_a_cut_line(mqar_sweep, tmp_path,
                                                                   capsys):
    """sweeps.publish on a copy of a sweep whose results.jsonl was cut mid-line (a
    snapshot taken while the runner wrote it): the whole records are published, the cut
    line is named on stderr, and the plots are copied under their published names."""
    import shutil

    from sweeps import publish

    _, workdir, records, _ = mqar_sweep
    sweeps_dir = tmp_path / "sweeps"
    shutil.copytree(workdir, sweeps_dir / "mqar")
    results = sweeps_dir / "mqar" / "results.jsonl"
    whole = results.read_text()
    results.write_text(whole + whole.splitlines()[0][:40])
    out = publish.collect(str(sweeps_dir), str(tmp_path / "docs"))
    assert out["sweeps"]["mqar"]["records"] == records
    assert "line 3 left out" in capsys.readouterr().err
    for name in out["sweeps"]["mqar"]["plots"]:
        assert (tmp_path / "docs" / name).is_file()


def test_a_cell_that_ran_only_some_of_its_lrs_is_a_partial_point(mqar_sweep):
    """The scatter marks a cell whose grid lrs did not all run (its best so far is a lower
    bound): the grid's lrs per cell against the lrs that have records."""
    from eval import report
    from sweeps import grid, outputs

    cfg, _, records, _ = mqar_sweep
    cell_lrs = outputs.grid_lrs(grid.select(grid.expand_grid(cfg), "softmax"))
    assert cell_lrs == {("T32_kv2", "softmax", "d16"): {0.001, 0.03}}
    full = outputs.recall_points(report.best_lr(records), cell_lrs)
    half = outputs.recall_points(report.best_lr(records[:1]), cell_lrs)
    assert [p["partial"] for p in full] == [False]
    assert [p["partial"] for p in half] == [True]
    assert half[0]["value"] == records[0]["metrics"]["accuracy"]


def test_a_grid_without_lrs_has_no_cell_lrs():
    """A timing grid (task speed) gives its runs no lr: their cells carry none, so the
    speed sweep's plot is drawn (grid_lrs once failed on lr None, losing speed.png)."""
    from sweeps import grid, outputs

    runs = grid.expand_grid({"task": "speed", "mixers": [{"name": "softmax"},
                                                         {"name": "gated_deltanet"}]})
    assert [r["lr"] for r in runs] == [None, None]
    assert outputs.grid_lrs(runs) == {}


def test_only_filters_what_runs_not_what_the_tables_show(mqar_sweep, tmp_path):
    """--only picks the runs of this invocation; results.jsonl / results.md still cover
    every finished run (e.g. ones an earlier --only invocation ran)."""
    import shutil

    from sweeps import runner

    cfg, workdir, records, _ = mqar_sweep
    wd = tmp_path / "only"
    shutil.copytree(workdir, wd)
    got = runner.sweep(cfg, str(wd), only="softmax__d16__lr0.03", progress=False)
    assert [r["run"] for r in got] == [r["run"] for r in records]   # nothing new ran
    lines = [json.loads(x)["run"] for x in (wd / "results.jsonl").read_text().splitlines()]
    assert lines == [r["run"] for r in records]
    assert "2 finished runs" in (wd / "results.md").read_text()


def test_grid_expansion_of_the_full_configs():
    from sweeps import grid

    mq = grid.expand_grid(load_compare_config("compare_mqar"))
    assert len(mq) == 4 * 11 * 3 * 4  # settings x mixers x widths x lrs
    r = next(r for r in mq if r["name"] == "T512_kv64__gated_deltanet__d256__lr0.01__s0")
    assert r["overrides"]["data.seq_len"] == 512
    assert r["overrides"]["data.num_kv_pairs"] == 64
    assert r["overrides"]["model.d_model"] == 256 and r["overrides"]["train.lr"] == 0.01
    sh = grid.expand_grid(load_compare_config("compare_shakespeare"))
    soft = sh[0]["overrides"]
    assert (soft["model.num_layers"], soft["model.num_heads"], soft["model.d_model"],
            soft["data.seq_len"], soft["train.batch_size"], soft["model.dropout"],
            soft["train.lr"], soft["train.steps"]) == (6, 6, 384, 256, 64, 0.2, 1e-3, 5000)
    hybrid = next(r for r in sh if r["mixer"] == "hybrid_8L")["overrides"]
    assert hybrid["model.softmax_every"] == 8 and hybrid["model.num_layers"] == 8


def test_shakespeare_seeds_variant_trains_each_mixer_as_a_three_seed_population():
    """:seeds is the nanoGPT recipe with seeds 0-2, a mixer's three runs one population:
    cells of three members that differ only in seed, with the recipe's overrides."""
    from sweeps import grid, populations

    base = grid.expand_grid(load_compare_config("compare_shakespeare"))
    cfg = load_compare_config("compare_shakespeare", "seeds")
    assert cfg["population"] is True
    populations.check_config(cfg)
    cells = populations.cells(grid.expand_grid(cfg), cfg)
    assert [c["name"] for c in cells] == [populations.cell_name(r) for r in base]
    for c, one in zip(cells, base):
        assert sorted(r["seed"] for r in c["runs"]) == [0, 1, 2]
        assert {r["lr"] for r in c["runs"]} == {1e-3}
        shared = {k: v for k, v in one["overrides"].items()
                  if k not in ("train.lr", "train.seed")}
        assert c["overrides"] == shared


def test_a_mixer_with_its_own_sizes_replaces_the_sweeps_sizes():
    """Zoology sizes the sliding window by its window at d128, the others by width: the
    window's cells are its own, every other mixer keeps the three widths."""
    from sweeps import grid

    cfg = load_compare_config("compare_mqar_zoology")
    runs = grid.expand_grid(cfg)
    cells = {(r["mixer"], r["size"]) for r in runs}
    window_cells = sorted(size for mixer, size in cells if mixer == "sliding_window")
    assert window_cells == ["d128", "d128_w128", "d128_w16", "d128_w32", "d64"]
    others = {mixer for mixer, _ in cells} - {"sliding_window"}
    assert all({size for m, size in cells if m == mixer} == {"d64", "d128", "d256"}
               for mixer in others)
    assert len(runs) == (3 * len(others) + 5) * len(cfg["lrs"]) * len(cfg["seeds"])
    name = "T256_kv16__sliding_window__d128_w16__lr0.01__s2"
    w16 = next(r for r in runs if r["name"] == name)
    assert (w16["overrides"]["model.window"], w16["overrides"]["model.d_model"],
            w16["overrides"]["model.mixer"], w16["overrides"]["train.seed"]) == (
        16, 128, "sliding_window", 2)


def test_unknown_task_is_named():
    from sweeps import grid

    with pytest.raises(ValueError, match="task='bogus'"):
        grid.expand_grid({"task": "bogus"})


@pytest.mark.slow
def test_tiny_niah_and_speed_sweeps(tmp_path):
    """The other two tasks end to end: NIAH heatmaps per mixer, speed table and plot."""
    from sweeps import runner

    cfg = load_compare_config("compare_niah", "tiny")
    cfg["runner"] = "inprocess"
    recs = runner.sweep(cfg, str(tmp_path / "niah"), progress=False)
    assert [r["mixer"] for r in recs] == ["softmax", "gated_deltanet"]
    for r in recs:
        cells = r["metrics"]["grid"]["cells"]
        assert [(c["length"], c["depth"]) for c in cells] == \
            [(n, d) for n in (64, 128) for d in (0.0, 0.5, 1.0)]
        assert r["metrics"]["exact"] == pytest.approx(np.mean([c["exact"] for c in cells]))
        assert (tmp_path / "niah" / f"niah_{r['mixer']}_d32.png").is_file()
    cfg = load_compare_config("compare_speed", "tiny")
    recs = runner.sweep(cfg, str(tmp_path / "speed"), progress=False)
    by = {r["mixer"]: r["metrics"]["decode"] for r in recs}
    gdn = by["gated_deltanet"]
    assert gdn["16"]["state_bytes"] == gdn["64"]["state_bytes"]
    assert by["softmax"]["64"]["state_bytes"] > by["softmax"]["16"]["state_bytes"]
    assert (tmp_path / "speed" / "speed.png").is_file()
    assert "decode tok/s @64" in (tmp_path / "speed" / "results.md").read_text()


def test_only_takes_comma_separated_alternatives(mqar_sweep, tmp_path):
    """--only=a,b runs the grid entries whose name contains a or b, and no others."""
    import shutil

    from sweeps import runner

    cfg, workdir, records, _ = mqar_sweep
    wd = tmp_path / "only"
    shutil.copytree(workdir, wd)
    first, second = (r["run"] for r in records)
    shutil.rmtree(wd / first)
    shutil.rmtree(wd / second)
    done = runner.sweep(cfg, str(wd), only=f"no-such-run,{second}", progress=False)
    assert [r["run"] for r in done] == [second] and not (wd / first).exists()


@pytest.mark.slow  # two speed sweeps (77 s on 2 cores)
def test_a_failed_speed_length_is_retried_without_stopping_the_sweep(tmp_path, monkeypatch):
    """A length that raises (an OOM, say) leaves its run partial (shown, partial.json, no
    done.json) while the sweep goes on to the next run; the next invocation measures that
    run again and, with the failure gone, finishes it."""
    from eval import speed
    from sweeps import runner

    cfg = load_compare_config("compare_speed", "tiny")
    real = speed.decode_time

    def oom_at_64(model, batch, context, new_tokens):
        if context == 64:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory (test)")
        return real(model, batch, context, new_tokens)

    monkeypatch.setattr(speed, "decode_time", oom_at_64)
    wd = tmp_path / "speed"
    recs = runner.sweep(cfg, str(wd), progress=False)
    assert [r["mixer"] for r in recs] == ["softmax", "gated_deltanet"]   # both attempted
    for r in recs:
        assert "decode 64 failed (RuntimeError)" in r["partial"]
        assert "tokens_per_s" in r["metrics"]["decode"]["16"]
        assert (wd / r["run"] / "partial.json").is_file()
        assert not (wd / r["run"] / "done.json").exists()
    assert "Failed or incomplete runs" in (wd / "results.md").read_text()
    monkeypatch.setattr(speed, "decode_time", real)
    recs = runner.sweep(cfg, str(wd), progress=False)
    for r in recs:
        assert not r.get("partial") and "tokens_per_s" in r["metrics"]["decode"]["64"]
        assert (wd / r["run"] / "done.json").is_file()
        assert not (wd / r["run"] / "partial.json").exists()
