"""Population sweeps (sweeps.populations): a grid cell's lrs x seeds trained as one
population give the per-run records a sweep of separate runs gives, and the Zoology
recipes' configs hold Zoology's numbers.

The separate-run side of the comparison is the session fixture `mqar_sweep`
(tests/sweeps/conftest.py: compare_mqar:tiny's softmax runs, lr 1e-3 and 3e-2).
"""
import json
import os

import numpy as np
import pytest

from tests.eval.conftest import load_compare_config

# What a record holds that depends on the wall clock or on how it was trained, not on
# the run: left out of the comparison.
TIMING = ("tokens_per_s", "train_wall_s", "wall_s", "member_dir", "population")


def _losses(run_dir):
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    return ({r["step"]: r["loss"] for r in rows if "loss" in r},
            {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r})


def _same_record(sep, pop, tol=1e-6):
    """Every field of the two records equal, numbers within tol (float32 rounding)."""
    assert set(sep) - set(TIMING) == set(pop) - set(TIMING)
    for key in set(sep) - set(TIMING):
        a, b = sep[key], pop[key]
        if key == "metrics":
            assert set(a) == set(b)
            for m in a:
                x, y = a[m], b[m]
                if isinstance(x, dict):  # per test setting
                    assert x.keys() == y.keys()
                    x, y = list(x.values()), [y[k] for k in x]
                np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float),
                                           rtol=0, atol=tol, err_msg=m)
        else:
            assert a == b, key


@pytest.fixture(scope="module")
def population_sweep(mqar_sweep, tmp_path_factory):
    """compare_mqar:tiny's softmax cell (lr 1e-3 and 3e-2, seed 0) as one population."""
    from sweeps import runner

    cfg = dict(mqar_sweep[0], population=True)
    workdir = tmp_path_factory.mktemp("population_sweep")
    records = runner.sweep(cfg, str(workdir), only="softmax", progress=False)
    return cfg, workdir, records


def test_population_records_equal_the_separate_runs(mqar_sweep, population_sweep):
    _, sep_dir, sep_records, _ = mqar_sweep
    _, pop_dir, pop_records = population_sweep
    assert [r["run"] for r in pop_records] == [r["run"] for r in sep_records]
    assert {r["resumed_from_step"] for r in pop_records + sep_records} == {0}
    for sep, pop in zip(sep_records, pop_records):
        _same_record(sep, pop)
        # the member trained where the record says, in its cell's population
        assert pop["member_dir"] == f"T32_kv2__softmax__d16/lr{pop['lr']:g}_seed0"
        assert pop["population"] == {"cell": "T32_kv2__softmax__d16", "members": 2}
        # its logged training and eval losses are the separate run's, step for step
        (sep_train, sep_eval) = _losses(sep_dir / sep["run"])
        (pop_train, pop_eval) = _losses(pop_dir / pop["member_dir"])
        assert sep_train.keys() == pop_train.keys() and sep_eval.keys() == pop_eval.keys()
        for s in sep_train:
            assert abs(sep_train[s] - pop_train[s]) <= 1e-6, (pop["run"], s)
        for s in sep_eval:
            assert abs(sep_eval[s] - pop_eval[s]) <= 1e-6, (pop["run"], s)
    # one record per run where a separate run's would be, and the same tables
    for r in pop_records:
        assert (pop_dir / r["run"] / "done.json").is_file()
    table = lambda d: (d / "results.md").read_text().split("## MQAR accuracy")[1]  # noqa
    assert table(pop_dir) == table(sep_dir)


def test_a_second_invocation_trains_nothing(population_sweep):
    from sweeps import runner

    cfg, workdir, records = population_sweep
    before = {r["run"]: os.path.getmtime(workdir / r["run"] / "done.json") for r in records}
    again = runner.sweep(cfg, str(workdir), only="softmax", progress=False)
    assert [r["run"] for r in again] == list(before)
    assert all(os.path.getmtime(workdir / n / "done.json") == t for n, t in before.items())


def test_publish_lists_a_member_without_its_record(population_sweep, tmp_path):
    """A member stopped before its done.json shows up among publish's incomplete runs
    under CELL/member, with its logged curve; recorded members do not."""
    import shutil

    from sweeps import publish

    _, workdir, records = population_sweep
    wd = tmp_path / "copy"
    shutil.copytree(workdir, wd)
    assert publish.incomplete_runs(str(wd)) == []
    os.remove(wd / records[0]["run"] / "done.json")
    (got,) = publish.incomplete_runs(str(wd))
    assert got["run"] == records[0]["member_dir"] == "T32_kv2__softmax__d16/lr0.001_seed0"
    assert got["last_step"] == 3
    assert [list(p) for p in got["curve"]] == records[0]["metrics"]["curve"]


def test_cells_shards_and_groups(tmp_path):
    from sweeps import grid, populations

    cfg = load_compare_config("compare_mqar_zoology", "paper")
    full = grid.expand_grid(cfg)
    cells = populations.cells(full, cfg)
    # 10 mixers x 3 widths, and the sliding window's 5 (window 64 at d64 and d128,
    # windows 16, 32, 128 at d128)
    assert len(full) == 456 and len(cells) == 38
    assert all(len(c["runs"]) == 12 for c in cells)    # 4 lrs x 3 seeds
    assert cells[0]["name"] == "T256_kv16__softmax__d64"
    assert "train.lr" not in cells[0]["overrides"]
    # shards split cells, never a cell's runs
    a, b = (populations.select(full, cfg, shard=s) for s in ("0/2", "1/2"))
    assert (len(a), len(b)) == (19 * 12, 19 * 12)      # 38 cells, whole
    assert not {r["name"] for r in a} & {r["name"] for r in b}
    assert {populations.cell_name(r) for r in a}.isdisjoint(
        {populations.cell_name(r) for r in b})
    # members standing at different saved steps train as separate populations, largest
    # step first; a group that is not an lrs x seeds product is split into products
    cell = cells[0]["runs"]
    for r, step in ((cell[0], 500), (cell[1], 500), (cell[2], 500)):   # lr 1e-4, 3 seeds
        (populations.member_dir(str(tmp_path), r) / "checkpoints" / str(step)).mkdir(
            parents=True)
    (populations.member_dir(str(tmp_path), cell[3]) / "checkpoints" / "250").mkdir(
        parents=True)
    got = populations.groups(cell, str(tmp_path))
    assert [[(r["lr"], r["seed"]) for r in g] for g in got[:1]] == \
        [[(cell[0]["lr"], s) for s in (0, 1, 2)]]
    assert [(r["lr"], r["seed"]) for r in got[1]] == [(cell[3]["lr"], 0)]
    rest = [(r["lr"], r["seed"]) for g in got[2:] for r in g]
    assert sorted(rest) == sorted((r["lr"], r["seed"]) for r in cell[4:])
    # the fresh members: lr 4.64e-4's seeds 1 and 2, then the last two lrs x 3 seeds
    assert [sorted({(r["lr"]) for r in g}) for g in got[2:]] == \
        [[cell[3]["lr"]], sorted({cell[6]["lr"], cell[9]["lr"]})]
    assert all(len({r["lr"] for r in g}) * len({r["seed"] for r in g}) == len(g)
               for g in got)


def test_population_max_members_cuts_a_cell_into_smaller_products(tmp_path, monkeypatch):
    """population_max_members: a cell's 4 lrs x 3 seeds train as populations of at most
    that many members, each an lrs x seeds product, every run in exactly one; a seed
    count above the limit splits the seeds too. run_cells reads it from the sweep config."""
    from sweeps import grid, populations

    cfg = load_compare_config("compare_mqar_zoology", "paper")
    assert cfg["population_max_members"] == 0
    cell = populations.cells(grid.expand_grid(cfg), cfg)[0]["runs"]
    everyone = sorted((r["lr"], r["seed"]) for r in cell)
    for limit, want_sizes in ((0, [12]), (12, [12]), (6, [6, 6]), (5, [3] * 4),
                              (2, [2, 1] * 4), (1, [1] * 12)):
        got = populations.groups(cell, str(tmp_path), limit)
        assert [len(g) for g in got] == want_sizes, limit
        assert sorted((r["lr"], r["seed"]) for g in got for r in g) == everyone
        assert all(len({r["lr"] for r in g}) * len({r["seed"] for r in g}) == len(g)
                   for g in got)
    seen = []
    monkeypatch.setattr(populations, "_run_group",
                        lambda cfg, cell, members, *a, **kw: seen.append(len(members)))
    populations.run_cells(dict(cfg, population_max_members=6), cell, str(tmp_path),
                          python="python", deadline=None, max_wall_s=0, log=print,
                          done=lambda r: None, keep_record=lambda *a: None,
                          write_outputs=lambda: None)
    assert seen == [6, 6]
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match="population_max_members"):
            populations.check_config(dict(cfg, population_max_members=bad))


def test_a_population_out_of_memory_is_tried_again_as_two_halves(tmp_path, monkeypatch):
    """A population that runs out of memory is split into two lrs x seeds products of
    half its size, again while they do (each member resumes from its own checkpoints);
    one member out of memory, or any other error, is recorded as failed."""
    from sweeps import grid, populations

    cfg = dict(load_compare_config("compare_mqar_zoology", "paper"), runner="inprocess")
    cell = populations.cells(grid.expand_grid(cfg), cfg)[0]
    tried, records = [], {}

    oom = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 35.90GiB"

    def train(cfg, overrides, cell_dir, lrs, seeds, fits=3, error=oom):
        tried.append(len(lrs) * len(seeds))
        if len(lrs) * len(seeds) > fits:
            raise RuntimeError(f"the population exited with 1; end of its log:\n{error}")

    monkeypatch.setattr(populations, "measure",
                        lambda cfg, run, *a: {"metrics": {}, "run": run["name"]})
    logs = []

    def run(cell_runs):
        tried.clear()
        records.clear()
        populations.run_cells(cfg, cell_runs, str(tmp_path), python="python",
                              deadline=None, max_wall_s=0, log=logs.append,
                              done=lambda r: None,
                              keep_record=lambda d, name, rec: records.update(
                                  {os.path.basename(d): name}),
                              write_outputs=lambda: None)

    monkeypatch.setattr(populations, "train_inprocess", train)
    run(cell["runs"])
    assert tried == [12, 6, 3, 3, 6, 3, 3]
    assert sorted(records) == sorted(r["name"] for r in cell["runs"])
    assert set(records.values()) == {"done.json"}
    assert any("ran out of memory with 12 members; next: populations of 6 + 6" in line
               for line in logs)

    monkeypatch.setattr(populations, "train_inprocess",
                        lambda *a: train(*a, fits=0))                   # never fits
    run(cell["runs"][:1])
    assert tried == [1] and set(records.values()) == {"failed.json"}

    monkeypatch.setattr(populations, "train_inprocess",
                        lambda *a: train(*a, fits=0, error="INVALID_ARGUMENT: shapes"))
    run(cell["runs"])
    assert tried == [12] and len(records) == 12
    assert set(records.values()) == {"failed.json"}


def test_a_resumed_population_records_the_step_its_members_resumed_from(tmp_path,
                                                                       monkeypatch):
    """Members trained by an earlier invocation up to a checkpoint and finished by this
    one are recorded with resumed_from_step (their train_wall_s is only this
    invocation's); members trained whole here record 0. Members at different steps train
    as separate populations, each recording its own step."""
    from sweeps import grid, populations, tasks

    cfg = dict(load_compare_config("compare_mqar_zoology", "paper"), runner="inprocess")
    cell = populations.cells(grid.expand_grid(cfg), cfg)[0]
    lr = cell["runs"][0]["lr"]
    runs = [r for r in cell["runs"] if r["lr"] == lr]  # one lr, its seeds
    assert len(runs) >= 2
    for r in runs[1:]:  # an earlier invocation saved these at step 150 (and 50)
        for step in (50, 150):
            (populations.member_dir(str(tmp_path), r) / "checkpoints" / str(step)).mkdir(
                parents=True)
    assert tasks.saved_step(populations.member_dir(str(tmp_path), runs[0])) == 0
    assert tasks.saved_step(populations.member_dir(str(tmp_path), runs[1])) == 150

    recorded, trained, logs = {}, [], []
    monkeypatch.setattr(populations, "train_inprocess",
                        lambda cfg, overrides, cell_dir, lrs, seeds: trained.append(seeds))
    monkeypatch.setattr(
        populations, "measure",
        lambda cfg, run, workdir, wall, members, started, resumed_from_step=0: recorded
        .update({run["seed"]: (resumed_from_step, members)}) or {"metrics": {}})
    populations.run_cells(cfg, runs, str(tmp_path), python="python", deadline=None,
                          max_wall_s=0, log=logs.append, done=lambda r: None,
                          keep_record=lambda d, name, rec: None,
                          write_outputs=lambda: None)
    later = [r["seed"] for r in runs[1:]]
    assert trained == [later, [runs[0]["seed"]]]  # the furthest members first
    assert recorded == {**{s: (150, len(later)) for s in later}, runs[0]["seed"]: (0, 1)}
    done_lines = [line for line in logs if " done (" in line]
    assert sum("resumed from step 150" in line for line in done_lines) == len(later)
    assert len(done_lines) == len(runs)


def test_population_command_is_the_cli_with_the_cells_flags():
    from sweeps import grid, populations

    cfg = load_compare_config("compare_mqar_zoology", "based")
    cell = populations.cells(grid.expand_grid(cfg), cfg)[0]
    cmd = populations.population_command(cfg, cell["overrides"], "W/c", [1e-3, 0.01],
                                         [0, 1, 2], "python")
    assert cmd[:3] == ["python", "-m", "training.population"]
    assert cmd[3].endswith("configs/mqar_zoology_based.py")
    assert cmd[4:7] == ["--workdir=W/c", "--lrs=0.001,0.01", "--seeds=0,1,2"]
    assert "--config.model.mixer=softmax" in cmd and "--config.model.num_heads=1" in cmd
    assert not any(c.startswith(("--config.train.lr", "--config.train.seed")) for c in cmd)


def test_a_grid_that_varies_more_than_lr_and_seed_is_refused():
    from sweeps import populations

    cfg = load_compare_config("compare_mqar_zoology", "tiny")
    assert populations.check_config(dict(cfg, population=True)) is None
    with pytest.raises(ValueError, match="lr_key='model.lr'"):
        populations.check_config(dict(cfg, lr_key="model.lr"))
    with pytest.raises(ValueError, match="speed task"):
        populations.check_config(dict(cfg, task="speed"))


def test_the_recipes_hold_zoologys_numbers():
    """zoology/experiments/paper_configs/{iclr24_zoology_figure2,arxiv24_based_figure2}/
    configs.py and zoology/config.py, as configs/mqar_zoology_{paper,based}.py cite."""
    from configs import mqar_zoology_based as based
    from configs import mqar_zoology_paper as paper

    np.testing.assert_allclose(paper.LRS, np.logspace(-4, -2, 4), rtol=1e-7)
    np.testing.assert_allclose(based.LRS, np.logspace(-3, -1.5, 4), rtol=1e-7)
    p, b = paper.get_config(), based.get_config()
    # 64 epochs of 100k, 32 epochs of 180k examples, at batch 256
    assert p.train.steps * p.train.batch_size == 64 * 100_000
    assert b.train.steps * b.train.batch_size == 32 * 180_000
    for c in (p, b):
        t = c.train
        assert (t.b1, t.b2, t.eps, t.weight_decay, t.warmup_steps, t.min_lr_ratio,
                t.grad_clip, t.batch_size) == (0.9, 0.999, 1e-8, 0.1, 0, 0.0, 0.0, 256)
        assert c.model.layer_pattern == "base_conv,mixer" and c.model.num_layers == 2
        assert c.data.vocab_size == 8192 and c.data.power_a == 0.01
    assert (p.data.seq_len, p.data.num_kv_pairs, p.data.random_non_queries) == \
        (256, 16, False)
    # 100k of (64, 4), 20k each of four more; the seven test settings of 1,000
    assert b.data.num_kv_pairs == [[64, 4, 5], [128, 8, 1], [256, 16, 1], [256, 32, 1],
                                   [256, 64, 1]]
    assert b.data.random_non_queries is True
    assert based.TEST_SETTINGS == [(64, 4), (64, 8), (64, 16), (128, 32), (256, 64),
                                   (512, 128), (1024, 256)]
    sweep = load_compare_config("compare_mqar_zoology", "based")
    assert sweep["metric"] == "settings_mean" and sweep["population"] is True
    assert [tuple(s) for s in sweep["eval"]["settings"]] == based.TEST_SETTINGS
    assert sweep["eval"]["state_seq_len"] == 1024
    refs = {(r["mixer"], r["state_size"]): r["value"] for r in sweep["references"]}
    assert refs[("gated_deltanet", 1.7e4)] == 0.99 and refs[("deltanet", 2.2e3)] == 0.79
    assert all(r["setting"] == "mixture" for r in sweep["references"])


@pytest.mark.slow  # two tiny sweeps of 4 runs each on the Based-era recipe (minutes)
def test_based_tiny_population_sweep_equals_separate_runs(tmp_path):
    """The Based-era recipe's machinery end to end, 2 lrs x 2 seeds: the mixture of
    settings, the seven-setting-style settings_mean, the state at eval.state_seq_len, the
    scatter with its reference points, separate runs (in-process) against one population
    (python -m training.population in a subprocess).

    The head is untied here: with Zoology's tied head, a member's first AdamW steps
    differ from its separate run's by more than float32 rounding (measured on
    compare_mqar_zoology:tiny, gated_deltanet d16: the training loss of step 2 4.6e-5
    apart at lr 3e-2, the eval losses 2.4e-6 at 3e-3, 7e-7 at 1e-3), as the tied
    embedding's near-zero gradient entries (|g| ~ eps) carry rounding differences of the
    vmapped matmuls into full-size Adam updates; untied, both lrs stay within 1e-6."""
    from sweeps import runner

    cfg = load_compare_config("compare_mqar_zoology", "based_tiny")
    cfg["mixers"] = cfg["mixers"][1:]  # gated_deltanet
    cfg["seeds"] = [0, 1]
    cfg["overrides"]["model"] = {"tie_embeddings": False}
    sep = runner.sweep(cfg, str(tmp_path / "sep"), progress=False)
    # the population through its CLI in a subprocess, as the GPU variants run it
    pop = runner.sweep(dict(cfg, population=True, runner="subprocess"),
                       str(tmp_path / "pop"), progress=False)
    log = (tmp_path / "pop" / "mixture__gated_deltanet__d16" / "population.log").read_text()
    assert log.startswith("$ ") and "-m training.population" in log.splitlines()[0]
    assert [r["run"] for r in pop] == [r["run"] for r in sep] and len(sep) == 4
    for a, b in zip(sep, pop):
        _same_record(a, b)
        assert set(a["metrics"]["settings"]) == {"T16_kv2", "T32_kv4", "T64_kv8"}
        assert a["state_seq_len"] == 64
    assert (tmp_path / "pop" / "recall_vs_state.png").stat().st_size > 1000
    md = (tmp_path / "pop" / "results.md").read_text()
    assert "## MQAR accuracy (settings_mean)" in md and "mean of 3 ± 95% (n seeds)" in md


@pytest.mark.slow  # two separate runs and a 2-member population, each with its NIAH grids
def test_niah_ruler_cell_as_a_population_gives_the_separate_runs_records(tmp_path):
    # compare_niah:ruler trains a cell's seeds as one population: the records (every
    # RULER task's grid) and the logged losses are those of the seeds' separate runs.
    from sweeps import runner

    cfg = load_compare_config("compare_niah", "ruler_tiny")
    assert cfg["population"] and load_compare_config("compare_niah", "ruler")["population"]
    cfg = dict(cfg, seeds=[0, 1])
    pop = runner.sweep(cfg, str(tmp_path / "pop"), only="softmax", progress=False)
    sep = runner.sweep(dict(cfg, population=False), str(tmp_path / "sep"), only="softmax",
                       progress=False)
    assert [r["run"] for r in pop] == [r["run"] for r in sep] and len(pop) == 2
    for a, b in zip(sep, pop):
        assert b["population"]["members"] == 2
        assert a["metrics"].keys() == b["metrics"].keys()
        for key, x in a["metrics"].items():
            y = b["metrics"][key]
            if isinstance(x, dict):  # a task's grid: each (length, depth) cell
                assert [(c["length"], c["depth"]) for c in x["cells"]] == \
                    [(c["length"], c["depth"]) for c in y["cells"]]
                for cx, cy in zip(x["cells"], y["cells"]):
                    assert cx["exact"] == cy["exact"], key
                    assert abs(cx["per_digit"] - cy["per_digit"]) <= 1e-6, key
            else:  # a number, or the validation curve's [step, loss] pairs
                np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float),
                                           rtol=0, atol=1e-6, err_msg=key)
        sep_train, _ = _losses(tmp_path / "sep" / a["run"])
        pop_train, _ = _losses(tmp_path / "pop" / b["member_dir"])
        assert sep_train.keys() == pop_train.keys() and sep_train
        for s in sep_train:
            assert abs(sep_train[s] - pop_train[s]) <= 1e-6, (b["run"], s)
