"""Issue 20: a run cannot lose or silently corrupt work. Each test injects one fault of
the issue's table into a copy of one tiny trained workdir (or a fresh one) and asserts
what must happen: the run resumes from the right step with bitwise-identical later
losses, or stops with one clear message and nothing lost."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.training.conftest import (ROOT, cli_args, config_from_command_line, run_cli,
                                     tiny_config)
from training import (checkpoint, config_tools, loop, metrics, workdir_lock)

# Checkpoints at 4 and 8, evaluations at 6 (saved when a new best), the end at 12.
RUN = {"train.checkpoint_every": 4, "train.eval_every": 6, "train.keep_checkpoints": 3}


def losses(workdir):
    return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}


def steps_on_disk(workdir):
    d = workdir / checkpoint.CHECKPOINT_DIR
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ref")
    result = loop.train(tiny_config(**RUN), str(workdir))
    return workdir, result


@pytest.fixture
def run_copy(trained, tmp_path):
    """A copy of the trained workdir to damage."""
    src, _ = trained
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


def _data_files(step_dir):
    files = glob.glob(str(step_dir / "params" / "ocdbt.process_0" / "d" / "*"))
    return sorted(files, key=os.path.getsize)


def _truncate(d):
    path = _data_files(d)[-1]
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_bit(d):
    path = _data_files(d)[-1]
    b = bytearray(open(path, "rb").read())
    b[len(b) // 2] ^= 0x08
    open(path, "wb").write(bytes(b))


def _params_of_step_8(d):
    # Readable arrays of another step: only the checksums can tell.
    shutil.rmtree(d / "params")
    shutil.copytree(d.parent / "8" / "params", d / "params")


FAULTS = {
    "empty_folder": lambda d: (shutil.rmtree(d), d.mkdir()),
    "missing_params_folder": lambda d: shutil.rmtree(d / "params"),
    "missing_meta_folder": lambda d: shutil.rmtree(d / "meta"),
    "missing_file": lambda d: os.remove(_data_files(d)[-1]),
    "truncated_file": _truncate,
    "flipped_bit": _flip_bit,
    "arrays_of_another_step": _params_of_step_8,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_damaged_newest_step_is_named_and_the_one_before_loaded(run_copy, fault, capsys):
    assert steps_on_disk(run_copy) == [6, 8, 12]
    newest = run_copy / checkpoint.CHECKPOINT_DIR / "12"
    FAULTS[fault](newest)
    _, _, _, step = checkpoint.load_for_eval(run_copy)
    assert step == 8
    line = [x for x in capsys.readouterr().err.splitlines() if "is damaged" in x]
    assert len(line) == 1 and line[0].startswith(
        f"checkpoint step 12 at {newest} is damaged: ") and "using step 8" in line[0]
    assert newest.is_dir()  # a reader moves nothing


# Every fault is detected through load_for_eval above; a full resume is checked for one
# fault in the default suite, for a second behind -m slow (each is a training run).
@pytest.mark.parametrize("fault", ["truncated_file",
                                   pytest.param("arrays_of_another_step",
                                                marks=pytest.mark.slow)])
def test_resume_skips_a_damaged_newest_step_with_identical_losses(trained, run_copy,
                                                                  fault, capsys):
    ref, _ = trained
    newest = run_copy / checkpoint.CHECKPOINT_DIR / "12"
    FAULTS[fault](newest)
    result = loop.train(tiny_config(**RUN), str(run_copy))
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if "is damaged" in x]
    assert len(line) == 1, err
    assert f"checkpoint step 12 at {newest} is damaged" in line[0]
    assert "resuming from step 8" in line[0] and "resuming from step 8" in err
    # Redone from step 8: every later loss bitwise the reference's, nothing duplicated.
    assert losses(run_copy) == losses(ref)
    assert result["step"] == 12
    # The damaged step is kept aside, not deleted; the good ones are all there.
    assert (run_copy / checkpoint.DAMAGED_DIR / "12").is_dir()
    assert steps_on_disk(run_copy) == [6, 8, 12]


@pytest.mark.parametrize("fault", ["empty_folder",
                                   pytest.param("truncated_file", marks=pytest.mark.slow)])
def test_cli_names_a_damaged_step_in_one_line(run_copy, fault):
    FAULTS[fault](run_copy / checkpoint.CHECKPOINT_DIR / "12")
    r = run_cli(cli_args(RUN, run_copy))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    # The damaged step's line, then the banner: no orbax warnings, no traceback (a
    # failed read leaves coroutines whose collection Python would print).
    reason = {"empty_folder": "the folder is empty",
              "truncated_file": "its "}  # arrays cannot be read (...OUT_OF_RANGE...)
    assert lines[0].startswith(f"checkpoint step 12 at {run_copy / 'checkpoints' / '12'} "
                               f"is damaged: {reason[fault]}"), r.stderr
    assert lines[0].endswith(f"; moved to {run_copy / checkpoint.DAMAGED_DIR / '12'}; "
                             f"resuming from step 8")
    assert lines[1].endswith("resuming from step 8") and len(lines) == 2, r.stderr
    assert sorted(losses(run_copy)) == list(range(1, 13))


def test_every_step_damaged_stops_and_moves_nothing(run_copy):
    for step in steps_on_disk(run_copy):
        shutil.rmtree(run_copy / checkpoint.CHECKPOINT_DIR / str(step) / "meta")
    before = (run_copy / "metrics.jsonl").read_text()
    with pytest.raises(loop.TrainingError, match="no checkpoint in .* can be read: step 12"):
        loop.train(tiny_config(**RUN), str(run_copy))
    assert steps_on_disk(run_copy) == [6, 8, 12]
    assert (run_copy / "metrics.jsonl").read_text() == before


def test_best_step_is_the_lowest_eval_loss_and_loads(trained):
    workdir, result = trained
    # The kept best: the lowest eval loss among the evaluated steps (6 and 12).
    evals = {e["step"]: e["eval_loss"] for e in metrics.read_metrics(workdir)
             if "eval_loss" in e}
    assert sorted(evals) == [6, 12]
    best = min(evals, key=evals.get)
    assert result["best_step"] == best
    _, _, _, step = checkpoint.load_for_eval(workdir, step=checkpoint.BEST)
    assert step == best
    # The eval commands' --step=best reaches it too (and --step=N that step).
    from eval import perplexity
    for flag, want in (("best", best), (str(min(evals)), min(evals))):
        got = perplexity.run(str(workdir), num_batches=1, batch_size=2, progress=False,
                             step=flag)
        assert got["step"] == want


def test_early_stopping_keeps_and_names_the_best_step(tmp_path, capsys):
    """lr 0: the eval loss never improves on the first eval (step 2), so patience 2
    stops the run at step 6; with keep_checkpoints 1 the kept steps are 6 (the newest)
    and 2 (the best), and the best is what step='best' loads."""
    kw = {"train.lr": 0.0, "train.eval_every": 2, "train.early_stop_patience": 2,
          "train.checkpoint_every": 4, "train.keep_checkpoints": 1}
    result = loop.train(tiny_config(**kw), str(tmp_path))
    assert result["step"] == 6 and result["best_step"] == 2
    assert "at step 2); stopping early" in capsys.readouterr().out
    assert steps_on_disk(tmp_path) == [2, 6]
    _, _, _, step = checkpoint.load_for_eval(tmp_path, step=checkpoint.BEST)
    assert step == 2


def test_best_is_kept_beside_the_newest(tmp_path):
    """keep 1: the newest step and, beside it, the lowest eval loss, though older; also
    after the run is started again (the losses are read back from the steps)."""
    import jax.numpy as jnp
    import optax
    params = {"w": jnp.arange(6.0)}
    opt = optax.adam(1e-3).init(params)
    ck = checkpoint.Checkpointer(tmp_path, keep=1)
    for step, loss in [(1, 3.0), (2, 1.0), (3, None), (4, 2.0)]:
        ck.save(step, params, opt, {"step": step}, force=True, eval_loss=loss)
    ck.wait()
    assert ck.all_steps() == [2, 4] and ck.best_step() == 2
    ck.close()
    ck = checkpoint.Checkpointer(tmp_path, keep=1)
    for step, loss in [(5, None), (6, 1.5), (7, float("nan"))]:
        ck.save(step, params, opt, {"step": step}, force=True, eval_loss=loss)
    ck.close()
    ck = checkpoint.Checkpointer(tmp_path, keep=1, read_only=True)
    assert ck.all_steps() == [2, 7] and ck.best_step() == 2
    ck.close()


# ------------------------------------------------------------------------ one writer
def test_second_writer_refused_naming_pid_and_host(run_copy):
    import socket
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run_copy / workdir_lock.LOCK_FILE).write_text(json.dumps(
            {"pid": other.pid, "host": socket.gethostname(), "started": "earlier"}))
        before = {p: (run_copy / p).read_text() for p in ("metrics.jsonl", "config.json")}
        with pytest.raises(loop.TrainingError,
                           match=f"in use by pid {other.pid} on host "
                                 f"{socket.gethostname()}"):
            loop.train(tiny_config(**RUN), str(run_copy))
        assert {p: (run_copy / p).read_text() for p in before} == before
        assert steps_on_disk(run_copy) == [6, 8, 12]
    finally:
        other.kill()
        other.wait()
    # Its process gone, the lock is stale: the next run takes it over, then releases it.
    with workdir_lock.held(run_copy) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not (run_copy / workdir_lock.LOCK_FILE).exists()


def test_cli_second_writer_is_one_line(tmp_path):
    import socket
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / workdir_lock.LOCK_FILE).write_text(json.dumps(
        {"pid": os.getpid(), "host": socket.gethostname()}))  # this test's pid: alive
    r = run_cli(cli_args({}, tmp_path / "w"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"error: workdir {tmp_path / 'w'} is in use by pid {os.getpid()}" in r.stderr
    assert {p.name for p in (tmp_path / "w").iterdir()} == {
        workdir_lock.GUARD_FILE, workdir_lock.LOCK_FILE}


# ------------------------------------------------------------------------ config keys
@pytest.mark.parametrize("key, value, expect", [
    ("train.lr", -0.01, "train.lr=-0.01: must be >= 0"),
    ("train.eval_batches", 0, "train.eval_batches=0: must be positive"),
    ("train.log_every", 0, "train.log_every=0: must be positive"),
    ("train.checkpoint_every", -1, "train.checkpoint_every=-1: must be >= 0"),
    ("model.mixer", "mamba", "model.mixer='mamba' is not a mixer; valid mixers: base"),
    ("data.num_kv_pairs", [2, 0], "data.num_kv_pairs=[2, 0]: use a positive integer"),
])
def test_impossible_values_stop_before_anything_runs(tmp_path, key, value, expect):
    with pytest.raises(config_tools.ConfigError) as e:
        loop.train(tiny_config(**{key: value}), str(tmp_path / "w"))
    assert expect in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "w").exists()


def test_val_fraction_zero_with_text_refused(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 200)
    config = tiny_config(**{"data.source": "files", "data.tokenizer": "byte",
                            "data.files": str(tmp_path / "a.txt"), "data.val_fraction": 0.0})
    with pytest.raises(config_tools.ConfigError, match="data.val_fraction=0 holds no text"):
        loop.train(config, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_cli_unknown_mixer_is_one_line(tmp_path):
    r = run_cli(cli_args({"model.mixer": "mamba"}, tmp_path / "w"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "valid mixers:" in errors[0] and "gated_deltanet" in errors[0]
    assert not (tmp_path / "w").exists()


def test_documented_mqar_keys_settable_from_the_command_line(monkeypatch):
    from training import builders
    argv = ["train.py", f"--config={ROOT / 'configs/mqar.py'}",
            "--config.data.num_kv_pairs=[2,4]", "--config.data.random_non_queries=True"]
    c = config_from_command_line(argv, monkeypatch)
    assert c.data.num_kv_pairs == [2, 4] and c.data.random_non_queries is True
    config_tools.check_config(c)
    d = builders.build_dataset(c)
    assert d.kv_choices == [2, 4] and d.random_non_queries


# ------------------------------------------------------------------------ resume changes
def test_resume_with_changed_seed_or_data_refused_naming_keys(run_copy):
    before = {p: (run_copy / p).read_text() for p in ("metrics.jsonl", "config.json")}
    with pytest.raises(config_tools.ConfigError) as e:
        loop.train(tiny_config(**RUN, **{"train.seed": 1, "data.num_kv_pairs": 3,
                                         "train.lr": 1e-3}), str(run_copy))
    msg = str(e.value)
    for part in ("train.seed 0 -> 1", "data.num_kv_pairs 2 -> 3", "train.lr 0.003 -> 0.001",
                 "train.allow_config_change=True"):
        assert part in msg, msg
    assert {p: (run_copy / p).read_text() for p in before} == before


def test_resume_with_allowed_change_is_recorded(trained, run_copy):
    ref, _ = trained
    over = dict(RUN, **{"train.steps": 14, "train.allow_config_change": True})
    result = loop.train(tiny_config(**over), str(run_copy))
    assert result["step"] == 14
    got = losses(run_copy)
    assert {s: got[s] for s in range(1, 13)} == losses(ref) and sorted(got)[-1] == 14
    history = [json.loads(x) for x in
               (run_copy / config_tools.CONFIG_HISTORY).read_text().splitlines()]
    assert history[0]["step"] == 12
    assert history[0]["changes"] == {"train.steps": {"old": 12, "new": 14}}
    assert json.loads((run_copy / "config.json").read_text())["train"]["steps"] == 14


# ------------------------------------------------------------------------ wandb, saves
def test_explicit_disabled_wandb_wins_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "online")
    assert metrics.wandb_mode("disabled") == "disabled"
    assert metrics.wandb_mode("offline") == "online"  # the documented override otherwise

    class NoWandb:
        def init(self, **kw):
            raise AssertionError("wandb.init called for a disabled run")

    monkeypatch.setitem(sys.modules, "wandb", NoWandb())
    logger = metrics.WandbLogger(tmp_path, mode="disabled", project="p", name="",
                                 config={})
    assert logger.run is None and not (tmp_path / "wandb_id.txt").exists()


def test_failed_save_stops_at_once_with_one_message(trained, tmp_path, monkeypatch,
                                                    caplog):
    """The checkpoint folder becomes unwritable during step 6 (a stand-in for a full disk
    or a lost mount): the run stops at that step, naming the save that failed. Once
    fixed, the same command carries on and ends with the reference's losses."""
    from training import builders
    build = builders.build_dataset
    work = tmp_path / "w"
    ckdir, hidden = work / checkpoint.CHECKPOINT_DIR, tmp_path / "hidden"

    class BreaksDisk:
        def __init__(self, d):
            self._d = d

        def __getattr__(self, name):
            return getattr(self._d, name)

        def batch(self, step, batch_size, split="train"):
            if step == 5 and split == "train" and ckdir.is_dir():
                shutil.move(str(ckdir), str(hidden))
                moved = 0
                while True:  # an in-flight async save may make the folder again between
                    try:     # the move and the write: move that one aside too, and retry
                        ckdir.write_text("not a folder")
                        break
                    except IsADirectoryError:
                        moved += 1
                        shutil.move(str(ckdir), str(tmp_path / f"remade{moved}"))
            return self._d.batch(step, batch_size, split)

    monkeypatch.setattr(builders, "build_dataset", lambda c: BreaksDisk(build(c)))
    with pytest.raises(loop.TrainingError) as e:
        loop.train(tiny_config(**RUN), str(work))
    msg = str(e.value)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no tracebacks
    # The save of step 4 may still be in flight when the folder goes (then it fails),
    # or done (then the save of 6, a new best eval, fails in the background): the run
    # stops at the step after the failure, not a checkpoint interval later.
    assert msg.startswith(("saving checkpoint step 4 to", "saving checkpoint step 6 to"))
    assert f"{ckdir} failed (" in msg and "\n" not in msg
    assert max(losses(work)) in (6, 7)
    monkeypatch.setattr(builders, "build_dataset", build)
    ckdir.unlink()
    shutil.move(str(hidden), str(ckdir))
    loop.train(tiny_config(**RUN), str(work))
    assert losses(work) == losses(trained[0])


# ------------------------------------------------------------------------ property
def test_random_documented_overrides_start_or_name_the_key():
    """Random --config.KEY=VALUE from the documented keys, checked as train.py does
    (types, then values, then the data and the model built): either all of it passes
    or one ConfigError line names the key. Nothing here trains; a run that passes these
    checks starts."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    from models.mixers import MIXERS
    ints = st.integers(-2, 40).map(str)
    values = {
        "train.lr": st.floats(-1, 1, allow_nan=False).map(repr),
        "train.steps": ints, "train.batch_size": ints, "train.log_every": ints,
        "train.eval_every": ints, "train.eval_batches": ints,
        "train.checkpoint_every": ints, "train.keep_checkpoints": ints,
        "train.grad_accum": ints, "train.warmup_steps": ints,
        "train.precision": st.sampled_from(["auto", "float32", "bfloat16", "float8"]),
        "train.prng_impl": st.sampled_from(["threefry2x32", "unsafe_rbg", "philox"]),
        "model.mixer": st.sampled_from(sorted(MIXERS) + ["mamba", ""]),
        "model.num_heads": st.integers(-1, 5).map(str),
        "model.d_model": st.sampled_from(["0", "16", "32", "48", "-8"]),
        "model.num_layers": st.integers(-1, 3).map(str),
        "data.seq_len": st.sampled_from(["0", "8", "16", "64"]),
        "data.num_kv_pairs": st.sampled_from(["1", "2", "8", "[2,4]", "[0]", "[]", "x"]),
        "data.random_non_queries": st.sampled_from(["true", "false", "maybe"]),
        "data.val_fraction": st.sampled_from(["0.0", "0.1", "-0.5", "1.5"]),
        "data.power_a": st.sampled_from(["0.01", "0.5", "0", "-1", "x"]),
        "data.mqar_vocab_size": st.sampled_from(["8", "64", "512", "0", "-3"]),
        "data.max_documents": st.sampled_from(["0", "10", "-1"]),
        "data.niah_kind": st.sampled_from(["passkey", "multikey", "haystack"]),
        "data.niah_depths": st.sampled_from(["[0.5]", "[0.1,0.9]", "[2]", "0.5", "[]"]),
        "data.num_digits": st.sampled_from(["5", "0", "-2"]),
        "logging.wandb": st.sampled_from(["offline", "disabled", "online", "loud"]),
    }
    import ast

    @hypothesis.settings(max_examples=100, deadline=None, database=None)
    @hypothesis.given(st.dictionaries(st.sampled_from(sorted(values)), st.just(None),
                                      min_size=1, max_size=4).flatmap(
        lambda ks: st.fixed_dictionaries({k: values[k] for k in ks})))
    def check(overrides):
        config = tiny_config()
        try:
            config_tools.check_overrides(config, overrides)
            typed = {}
            for k, text in overrides.items():  # parsed as ml_collections' flags do
                kind, _ = config_tools._field_type(config, k)
                if kind is bool:
                    typed[k] = text.lower() in ("true", "1", "yes")
                elif kind is str:
                    typed[k] = text
                else:
                    try:
                        typed[k] = ast.literal_eval(text)
                    except (ValueError, SyntaxError):  # a literal flag's string
                        typed[k] = text
            config_tools.set_values(config, typed)
            config_tools.check_config(config)
            loop._dataset_and_model_config(config)
        except config_tools.ConfigError as e:
            msg = str(e)
            assert "\n" not in msg
            leaves = {k.rsplit(".", 1)[-1] for k in overrides}
            assert any(leaf in msg for leaf in leaves), (overrides, msg)
    check()
