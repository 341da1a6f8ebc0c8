"""Population training (training.population): every member's losses are those of a
separate train.py run (training.loop.train) of the same lr and seed, through a stop and
resume and through another member's early stop.

The reference is the separate run itself. The tolerance is 1e-6 (float32): the vmapped
optimizer update rounds a few elements an ulp differently from a separate run's (the
gradients at equal parameters are bitwise equal), which moves a loss of about 4 by at
most two float32 ulps (4.8e-7 each) over these 12 steps; a resumed population is
compared bitwise with the uninterrupted one."""
import pytest

from tests.training.conftest import tiny_config
from training import loop, metrics, population

LRS, SEEDS = (1e-3, 3e-3), (0, 1)


def losses(workdir):
    return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}


def evals(workdir):
    return [(e["step"], e["eval_loss"]) for e in metrics.read_metrics(workdir)
            if "eval_loss" in e]


def member_dir(root, lr, seed):
    return root / population.member_name(lr, seed)


@pytest.fixture(scope="module")
def full_population(tmp_path_factory):
    root = tmp_path_factory.mktemp("population")
    results = population.train_population(tiny_config(), root, LRS, SEEDS)
    return root, results


def test_members_equal_separate_runs(full_population, tmp_path):
    root, results = full_population
    assert [(r["lr"], r["seed"]) for r in results] == [(lr, s) for lr in LRS for s in SEEDS]
    for r in results:
        lr, seed = r["lr"], r["seed"]
        ref_dir = tmp_path / f"sep_{lr}_{seed}"
        ref = loop.train(tiny_config(**{"train.lr": lr, "train.seed": seed}), ref_dir)
        expected, got = losses(ref_dir), losses(member_dir(root, lr, seed))
        assert sorted(got) == sorted(expected) == list(range(1, 13))
        gap = max(abs(got[s] - expected[s]) for s in expected)
        assert gap <= 1e-6, (lr, seed, gap)
        assert r["eval_loss"] == pytest.approx(ref["eval_loss"], abs=1e-6)
        assert r["status"] == "done" and r["step"] == 12
    # Members differ (their own seeds and lrs), so a mixed-up stream would show above.
    firsts = {losses(member_dir(root, lr, s))[1] for lr in LRS for s in SEEDS}
    assert len(firsts) == len(SEEDS)  # step 1 has lr 0 (warmup): its loss is the seed's


@pytest.mark.slow  # a population and reference runs each (about 30-55 s)
def test_stop_and_resume_is_bitwise_the_uninterrupted_population(full_population, tmp_path):
    root, _ = full_population
    with pytest.raises(loop.Interrupted) as stopped:
        population.train_population(tiny_config(), tmp_path, LRS, SEEDS, stop_at=6)
    assert stopped.value.step == 6
    for lr in LRS:
        for s in SEEDS:
            assert max(losses(member_dir(tmp_path, lr, s))) == 6
    # A kill between two members' saves: one member lacks step 6, so every member goes
    # back to step 4, the newest step all of them have.
    import shutil
    from training import checkpoint
    shutil.rmtree(member_dir(tmp_path, LRS[0], SEEDS[0]) / checkpoint.CHECKPOINT_DIR / "6")
    population.train_population(tiny_config(), tmp_path, LRS, SEEDS)
    for lr in LRS:
        for s in SEEDS:
            assert losses(member_dir(tmp_path, lr, s)) == losses(member_dir(root, lr, s))
            assert evals(member_dir(tmp_path, lr, s)) == evals(member_dir(root, lr, s))


@pytest.mark.slow  # a population and reference runs each (about 30-55 s)
def test_early_stop_freezes_only_that_member(tmp_path):
    # lr 0 never changes its parameters: its second evaluation is no new best, so with
    # patience 1 it stops at step 8; the lr 3e-3 member trains on to step 12.
    over = {"train.eval_every": 4, "train.early_stop_patience": 1}
    results = population.train_population(tiny_config(**over), tmp_path / "pop",
                                          (0.0, 3e-3), (0,), park="never")
    stopped, going = results
    assert (stopped["status"], stopped["step"]) == ("stopped early", 8)
    assert (going["status"], going["step"]) == ("done", 12)
    for r in results:
        ref_dir = tmp_path / f"sep_{r['lr']}"
        ref = loop.train(tiny_config(**over, **{"train.lr": r["lr"]}), ref_dir)
        assert ref["step"] == r["step"]
        expected, got = losses(ref_dir), losses(member_dir(tmp_path / "pop", r["lr"], 0))
        assert sorted(got) == sorted(expected)
        assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6
        assert [s for s, _ in evals(member_dir(tmp_path / "pop", r["lr"], 0))] == \
            [s for s, _ in evals(ref_dir)]


@pytest.mark.slow  # three populations (about 40 s)
def test_stopped_member_leaves_the_step_and_a_resume_is_bitwise(tmp_path, monkeypatch):
    # lr 0 stops at step 8 (as above): from there the step computes only the lr 3e-3
    # member, which trains on exactly as in the separate run; a population killed at
    # step 10 resumes with the stopped member parked from the start, bitwise.
    import jax
    rows_seen = []
    compile_steps = population._compile

    def recording(*args, **kw):
        train, evaluate = compile_steps(*args, **kw)

        def counted(params, *rest):
            rows_seen.append(jax.tree.leaves(params)[0].shape[0])
            return train(params, *rest)
        return counted, evaluate
    monkeypatch.setattr(population, "_compile", recording)
    over = {"train.eval_every": 4, "train.early_stop_patience": 1}
    whole = population.train_population(tiny_config(**over), tmp_path / "whole",
                                        (0.0, 3e-3), (0,), park="always")
    assert rows_seen == [2] * 8 + [1] * 4
    ref_dir = tmp_path / "sep"
    loop.train(tiny_config(**over, **{"train.lr": 3e-3}), ref_dir)
    expected, got = losses(ref_dir), losses(member_dir(tmp_path / "whole", 3e-3, 0))
    assert sorted(got) == sorted(expected) == list(range(1, 13))
    assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6

    rows_seen.clear()
    with pytest.raises(loop.Interrupted):
        population.train_population(tiny_config(**over), tmp_path / "cut", (0.0, 3e-3),
                                    (0,), stop_at=10, park="always")
    resumed = population.train_population(tiny_config(**over), tmp_path / "cut",
                                          (0.0, 3e-3), (0,), park="always")
    assert rows_seen == [2] * 8 + [1] * 2 + [1] * 2
    for lr in (0.0, 3e-3):
        assert losses(member_dir(tmp_path / "cut", lr, 0)) == \
            losses(member_dir(tmp_path / "whole", lr, 0))
        assert evals(member_dir(tmp_path / "cut", lr, 0)) == \
            evals(member_dir(tmp_path / "whole", lr, 0))
    assert [(r["status"], r["step"], r["eval_loss"]) for r in resumed] == \
        [(r["status"], r["step"], r["eval_loss"]) for r in whole]


def test_parking_pays_for_its_compilation_or_is_not_done():
    # 12 rows, 3 still training: 9/12 of each step's time saved over the steps left
    assert population.worth_parking(12, 3, 1564, 0.12, 60.0)      # 141 s > 2 x 60 s
    assert not population.worth_parking(12, 3, 1564, 0.1, 60.0)   # 117 s
    assert not population.worth_parking(12, 9, 1564, 0.12, 60.0)  # 47 s
    assert not population.worth_parking(12, 3, 391, 0.12, 60.0)   # 35 s
    assert population.worth_parking(12, 3, 391, 0.12, 1.0)        # a CPU's compile
    assert population.worth_parking(12, 3, 1, None, None)         # nothing measured yet
    from training import config_tools
    with pytest.raises(config_tools.ConfigError, match="park"):
        population.train_population(tiny_config(), "/nonexistent", (1e-3,), (0,),
                                    park="sometimes")


def test_cli_freezes_a_diverging_member_and_prints_the_table(full_population, tmp_path):
    # lr inf makes step 1's update NaN (0 * inf in the warmup): that member is frozen
    # and named; the other member trains on exactly as in the 4-member population.
    import json
    import subprocess
    import sys
    from tests.training.conftest import ROOT, TINY, env
    root, _ = full_population
    args = ([sys.executable, "-m", "training.population",
             "--config=" + str(ROOT / "configs/mqar.py"), f"--workdir={tmp_path}",
             "--lrs=inf,1e-3", "--seeds=0"]
            + [f"--config.{k}={v}" for k, v in TINY.items()])
    done = subprocess.run(args, cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| inf | 0 | 0 | nan | nan | diverged at step 1 |" in done.stdout, done.stdout
    assert "| 0.001 | 0 | 12 |" in done.stdout
    assert json.loads((tmp_path / population.POPULATION_FILE).read_text()) == {
        "diverged": {population.member_name(float("inf"), 0): 1}}
    assert losses(member_dir(tmp_path, float("inf"), 0)) == {}
    got, expected = losses(member_dir(tmp_path, 1e-3, 0)), losses(member_dir(root, 1e-3, 0))
    assert sorted(got) == sorted(expected)
    assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6


@pytest.mark.slow
def test_sigkill_then_rerun_of_the_cli_gives_bitwise_same_losses(tmp_path):
    # A real kill (no save on the way out) at some step past the first checkpoint, then
    # the same command: every member's losses are those of a population never stopped.
    import signal
    import subprocess
    import sys
    import time
    from tests.training.conftest import ROOT, TINY, env
    over = dict(TINY, **{"train.steps": 60, "train.checkpoint_every": 10})

    def args(workdir):
        return ([sys.executable, "-m", "training.population",
                 "--config=" + str(ROOT / "configs/mqar.py"), f"--workdir={workdir}",
                 "--lrs=1e-3,3e-3", "--seeds=0,1"]
                + [f"--config.{k}={v}" for k, v in over.items()])

    ref = subprocess.run(args(tmp_path / "ref"), cwd=ROOT, env=env(), capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr
    work = tmp_path / "killed"
    proc = subprocess.Popen(args(work), cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = member_dir(work, 3e-3, 1) / "checkpoints" / "10"
    t0 = time.time()
    while not first.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() - t0 < 300, "timed out"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = subprocess.run(args(work), cwd=ROOT, env=env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert "resuming from step" in again.stderr
    for lr in (1e-3, 3e-3):
        for s in (0, 1):
            got = losses(member_dir(work, lr, s))
            expected = losses(member_dir(tmp_path / "ref", lr, s))
            assert sorted(got) == list(range(1, 61))
            assert got == expected


def test_early_stop_accuracy_stops_a_member_where_its_separate_run_stops(tmp_path):
    # The threshold sits between the lr 1e-2 run's best accuracy so far and the first
    # eval that beats it, so that run stops there; the member stops at the same step with
    # the same losses, and the lr 0 member (accuracy fixed at its first eval's) does not.
    kw = {"train.steps": 12, "train.eval_every": 2, "train.checkpoint_every": 0}
    whole_dir = tmp_path / "whole"
    loop.train(tiny_config(**kw, **{"train.lr": 1e-2}), whole_dir)
    acc = [(e["step"], e["eval_accuracy"]) for e in metrics.read_metrics(whole_dir)
           if "eval_accuracy" in e and e["step"] < 12]
    fixed = population.train_population(tiny_config(**kw), tmp_path / "fixed", (0.0,), (0,))
    floor = fixed[0]["eval_accuracy"]  # lr 0: every eval sees the initial parameters
    record, stop_at, threshold = max(floor, acc[0][1]), None, None
    for step, a in acc[1:]:
        if a > record:
            stop_at, threshold = step, (record + a) / 2
            break
    assert stop_at is not None, f"the tiny run never beat its first accuracy: {acc}"
    over = dict(kw, **{"train.early_stop_accuracy": threshold})
    results = population.train_population(tiny_config(**over), tmp_path / "pop",
                                          (0.0, 1e-2), (0,))
    still, stopped = results
    assert (still["status"], still["step"]) == ("done", 12)
    assert (stopped["status"], stopped["step"]) == ("stopped early", stop_at)
    ref_dir = tmp_path / "sep"
    ref = loop.train(tiny_config(**over, **{"train.lr": 1e-2}), ref_dir)
    assert ref["step"] == stop_at
    expected, got = losses(ref_dir), losses(member_dir(tmp_path / "pop", 1e-2, 0))
    assert sorted(got) == sorted(expected)
    assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6


MESH_POPULATION = """
import json, sys
from tests.training.conftest import tiny_config
from training import metrics, population
over = {"train.eval_every": 4, "train.early_stop_patience": 1, "mesh.data": 2,
        "mesh.fsdp": 2}
population.train_population(tiny_config(**over), sys.argv[1], (0.0, 3e-3), (0, 1),
                            park="always")
"""


@pytest.mark.slow  # a population on 4 simulated devices beside one on 1 (about 30 s)
def test_population_on_a_mesh_parks_stopped_members_as_on_one_device(tmp_path):
    # Members stacked over a data x fsdp mesh: the lr-0 members stop at step 8 and leave
    # the step (their parked state keeps its layout); every member's losses are those of
    # the same population on one device, within float32 rounding of the sharded sums.
    import subprocess
    import sys
    from tests.training.conftest import ROOT, env
    done = subprocess.run([sys.executable, "-c", MESH_POPULATION, str(tmp_path / "mesh")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env(XLA_FLAGS="--xla_force_host_platform_device_count=4"))
    assert done.returncode == 0, done.stderr
    over = {"train.eval_every": 4, "train.early_stop_patience": 1}
    population.train_population(tiny_config(**over), tmp_path / "one", (0.0, 3e-3), (0, 1),
                                park="always")
    for lr in (0.0, 3e-3):
        for s in (0, 1):
            got = losses(member_dir(tmp_path / "mesh", lr, s))
            want = losses(member_dir(tmp_path / "one", lr, s))
            assert sorted(got) == sorted(want) == list(range(1, 9 if lr == 0 else 13))
            assert max(abs(got[k] - want[k]) / abs(want[k]) for k in want) <= 1e-5
            assert [k for k, _ in evals(member_dir(tmp_path / "mesh", lr, s))] == \
                [k for k, _ in evals(member_dir(tmp_path / "one", lr, s))]


def test_members_with_a_layer_loss_equal_separate_runs(tmp_path):
    # Hedgehog's attention distillation (models.auxiliary) collected inside the vmapped
    # step: each member still trains as its separate run does.
    over = {"model.mixer": "hedgehog", "model.hedgehog_distill": 1.0}
    population.train_population(tiny_config(**over), tmp_path / "pop", LRS[1:], SEEDS)
    for seed in SEEDS:
        ref_dir = tmp_path / f"sep_{seed}"
        loop.train(tiny_config(**over, **{"train.lr": LRS[1], "train.seed": seed}), ref_dir)
        expected, got = losses(ref_dir), losses(member_dir(tmp_path / "pop", LRS[1], seed))
        assert sorted(got) == sorted(expected) == list(range(1, 13))
        assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6, seed
