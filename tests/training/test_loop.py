"""The training loop end to end on a tiny MQAR model, against independent references."""
import json
import re

import jax
import numpy as np
from flax import nnx
import pytest

from tests.training.conftest import tiny_config
from training import builders, checkpoint, config_tools, loop, metrics


def np_masked_xent(logits, targets, mask):
    """float64 NumPy: (sum of masked -log p(target), mask count, correct count)."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    correct = (np.argmax(z, -1) == targets)
    return (nll * mask).sum(), mask.sum(), (correct * mask).sum()


def train_losses(workdir):
    return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run shared by the tests below (12 steps, checkpoints at 4, 8, 12)."""
    workdir = tmp_path_factory.mktemp("run")
    result = loop.train(tiny_config(), str(workdir))
    return workdir, result


def test_first_loss_is_masked_cross_entropy_of_initial_model(trained):
    workdir, _ = trained
    config = tiny_config()
    dataset = builders.build_dataset(config)
    model = builders.model_factory(builders.build_model_config(config, dataset),
                                   config.train.seed)()
    batch = dataset.batch(0, config.train.batch_size)
    logits = model(batch["inputs"], segment_ids=batch["segment_ids"])
    s, n, _ = np_masked_xent(logits, batch["targets"], batch["mask"])
    assert train_losses(workdir)[1] == pytest.approx(s / n, rel=1e-5)


def test_load_for_eval_reproduces_final_eval(trained):
    workdir, result = trained
    model, config, dataset, step = checkpoint.load_for_eval(workdir)
    assert step == 12 and config.model.d_model == 32
    total = np.zeros(3)
    for b in dataset.eval_batches(config.train.batch_size, config.train.eval_batches):
        total += np_masked_xent(model(b["inputs"], segment_ids=b["segment_ids"]),
                                b["targets"], b["mask"])
    assert result["eval_loss"] == pytest.approx(total[0] / total[1], rel=1e-5)
    assert result["eval_accuracy"] == pytest.approx(total[2] / total[1], abs=1e-9)
    # The log has every step once, then the final eval; config.json is the run's config.
    entries = metrics.read_metrics(workdir)
    assert [e["step"] for e in entries if "loss" in e] == list(range(1, 13))
    assert entries[-1]["step"] == 12 and "eval_loss" in entries[-1]
    assert {"lr", "tokens_per_s"} <= set(entries[0])
    assert "mfu" not in entries[0]  # a CPU: no known peak (test_mfu_against_a_given_peak)
    assert json.loads((workdir / "config.json").read_text())["model"]["d_model"] == 32


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    one = loop.train(tiny_config(**{"train.steps": 4}), str(tmp_path / "a"))
    two = loop.train(tiny_config(**{"train.steps": 4, "train.grad_accum": 2}),
                     str(tmp_path / "b"))
    la, lb = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    for s in la:
        assert lb[s] == pytest.approx(la[s], rel=1e-5)
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-5)


class _PoisonedAt:
    """Wraps a dataset so that the batch of one step carries a NaN mask: the loss and the
    gradients of that step are NaN (a stand-in for a numerically bad batch)."""

    def __init__(self, dataset, step):
        self._d, self._step = dataset, step

    def __getattr__(self, name):
        return getattr(self._d, name)

    def batch(self, step, batch_size, split="train"):
        b = self._d.batch(step, batch_size, split)
        if step == self._step and split == "train":
            b = dict(b, mask=b["mask"] * np.float32("nan"))
        return b


def test_nan_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    build = builders.build_dataset
    monkeypatch.setattr(builders, "build_dataset", lambda c: _PoisonedAt(build(c), 2))
    config = tiny_config(**{"train.checkpoint_every": 1, "train.log_every": 4})
    # The batch of index 2 is update 3: its loss and gradients are NaN; step 3 is a
    # checkpoint step, and must not be saved.
    with pytest.raises(loop.TrainingError,
                       match=r"loss is nan at step 3; stopping without "
                             r"saving \(the last good checkpoint is step 2"):
        loop.train(config, str(tmp_path))
    ck = checkpoint.Checkpointer(tmp_path)
    assert ck.all_steps() == [1, 2]
    ck.close()
    assert max(e["step"] for e in metrics.read_metrics(tmp_path)) <= 2
    monkeypatch.setattr(builders, "build_dataset", build)
    model, _, dataset, step = checkpoint.load_for_eval(tmp_path)  # the good one still loads
    b = dataset.batch(0, 2)
    assert step == 2 and np.isfinite(np.asarray(model(b["inputs"]))).all()


def test_diverging_parameters_are_not_saved(tmp_path):
    # lr 1e30, no clipping or warmup: the weights blow up within a few steps; whatever step
    # it is caught at, no checkpoint at or after it exists.
    config = tiny_config(**{"train.lr": 1e30, "train.warmup_steps": 0,
                            "train.grad_clip": 0.0, "train.checkpoint_every": 1})
    with pytest.raises(loop.TrainingError) as e:
        loop.train(config, str(tmp_path))
    m = re.search(r"at step (\d+); stopping without saving", str(e.value))
    assert m, str(e.value)
    ck = checkpoint.Checkpointer(tmp_path)
    assert max(ck.all_steps(), default=0) < int(m.group(1))
    ck.close()


def test_checkpoint_of_another_model_is_refused_and_kept(trained, tmp_path):
    workdir, _ = trained
    before = (workdir / "config.json").read_text()
    metrics_before = (workdir / "metrics.jsonl").read_text()
    for key, value, name in [("model.mixer", "gated_deltanet", "gated_deltanet"),
                             ("model.d_model", 48, "d_model=32 there, 48 here"),
                             # linear attention has softmax's parameter shapes: named by key
                             ("model.mixer", "linear", "model.mixer='softmax'")]:
        with pytest.raises(checkpoint.CheckpointMismatch) as e:
            loop.train(tiny_config(**{key: value, "train.steps": 20}), str(workdir))
        assert name in str(e.value) and "fresh --workdir" in str(e.value)
    # Nothing was lost or overwritten.
    assert (workdir / "config.json").read_text() == before
    assert (workdir / "metrics.jsonl").read_text() == metrics_before
    ck = checkpoint.Checkpointer(workdir)
    assert ck.latest_step() == 12
    ck.close()


def test_missing_and_empty_files_are_named(tmp_path):
    config = tiny_config(**{"data.source": "files", "data.tokenizer": "byte",
                            "data.files": str(tmp_path / "nope.txt")})
    with pytest.raises(config_tools.ConfigError, match="nope.txt"):
        loop.train(config, str(tmp_path / "w1"))
    (tmp_path / "empty.txt").write_text("")
    config.data.files = str(tmp_path / "empty.txt")
    with pytest.raises(config_tools.ConfigError, match="empty.txt.*empty"):
        loop.train(config, str(tmp_path / "w2"))


def test_remat_is_exact_and_bfloat16_is_close_with_float32_params(tmp_path):
    steps = {"train.steps": 3, "train.checkpoint_every": 0}
    loop.train(tiny_config(**steps), str(tmp_path / "f32"))
    loop.train(tiny_config(**steps, **{"train.remat": True}), str(tmp_path / "remat"))
    loop.train(tiny_config(**steps, **{"train.precision": "bfloat16"}),
               str(tmp_path / "bf16"))
    f32, remat, bf16 = (train_losses(tmp_path / n) for n in ("f32", "remat", "bf16"))
    for s in f32:
        # Recomputation changes no value; bf16 matmuls keep about 3 digits.
        assert remat[s] == pytest.approx(f32[s], rel=1e-6)
        assert bf16[s] == pytest.approx(f32[s], rel=3e-2)
    assert bf16 != f32  # bfloat16 compute really happened
    model, config, _, _ = checkpoint.load_for_eval(tmp_path / "bf16")
    assert config.train.precision == "bfloat16"
    param_dtypes = {str(p.dtype) for p in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert param_dtypes == {"float32"}


def test_prng_impl_is_used_for_the_run_and_scoped_to_it(tmp_path):
    """train.prng_impl keys init and dropout (losses change, and repeat exactly), and the
    process default is back afterwards."""
    kw = {"train.steps": 3, "train.checkpoint_every": 0, "model.dropout": 0.3}
    runs = {}
    for name, impl in (("fry", "threefry2x32"), ("rbg_a", "unsafe_rbg"),
                       ("rbg_b", "unsafe_rbg")):
        loop.train(tiny_config(**kw, **{"train.prng_impl": impl}), str(tmp_path / name))
        runs[name] = train_losses(tmp_path / name)
    assert runs["rbg_a"] == runs["rbg_b"]
    assert all(runs["fry"][s] != runs["rbg_a"][s] for s in runs["fry"])
    assert str(jax.random.key(0).dtype) == "key<fry>"
    with pytest.raises(config_tools.ConfigError, match="prng_impl"):
        loop.train(tiny_config(**{"train.prng_impl": "philox"}), str(tmp_path / "bad"))


def test_early_stopping_stops_where_an_uninterrupted_run_would(tmp_path):
    """lr 0 keeps the model fixed, so the eval loss never improves after the first eval:
    with patience 2 and an eval every 2 steps the run stops at step 6. A run that crashed
    after its step-4 checkpoint stops there too when resumed (the patience count travels in
    the checkpoint), and a stopped run started again stays stopped."""
    import shutil
    kw = {"train.lr": 0.0, "train.eval_every": 2, "train.early_stop_patience": 2,
          "train.checkpoint_every": 4}
    whole = loop.train(tiny_config(**kw), str(tmp_path / "whole"))
    assert whole["step"] == 6
    assert max(train_losses(tmp_path / "whole")) == 6

    shutil.copytree(tmp_path / "whole", tmp_path / "crashed")
    shutil.rmtree(tmp_path / "crashed" / "checkpoints" / "6")  # as if killed after step 4
    resumed = loop.train(tiny_config(**kw), str(tmp_path / "crashed"))
    assert resumed["step"] == 6
    assert train_losses(tmp_path / "crashed") == train_losses(tmp_path / "whole")

    again = loop.train(tiny_config(**kw), str(tmp_path / "whole"))
    assert again["step"] == 6 and max(train_losses(tmp_path / "whole")) == 6


def eval_accuracies(workdir) -> dict:
    with open(workdir / "metrics.jsonl") as f:
        entries = [json.loads(line) for line in f]
    return {e["step"]: e["eval_accuracy"] for e in entries if "eval_accuracy" in e}


def test_early_stop_accuracy_stops_at_the_first_eval_above_it(tmp_path):
    """train.early_stop_accuracy (Zoology's stop at valid accuracy > 0.99): a run stops at
    the first evaluation whose accuracy exceeds the threshold, with the losses of the
    uninterrupted run up to there; a threshold above every accuracy never stops it."""
    kw = {"train.steps": 12, "train.eval_every": 2, "train.checkpoint_every": 0,
          "train.lr": 1e-2}
    whole = loop.train(tiny_config(**kw), str(tmp_path / "whole"))
    acc = eval_accuracies(tmp_path / "whole")
    steps = sorted(s for s in acc if s < whole["step"])
    # The first eval that sets a new record above every earlier one (and above 0).
    record, stop_at, threshold = 0.0, None, None
    for s in steps:
        if acc[s] > record:
            if s > steps[0]:
                stop_at, threshold = s, (record + acc[s]) / 2
                break
            record = acc[s]
    assert stop_at is not None, f"the tiny run never improved its accuracy: {acc}"
    stopped = loop.train(tiny_config(**kw, **{"train.early_stop_accuracy": threshold}),
                         str(tmp_path / "stopped"))
    assert stopped["step"] == stop_at
    losses = train_losses(tmp_path / "stopped")
    assert losses == {s: v for s, v in train_losses(tmp_path / "whole").items()
                      if s <= stop_at}
    never = loop.train(tiny_config(**kw, **{"train.early_stop_accuracy": 0.999999}),
                       str(tmp_path / "never"))
    assert never["step"] == 12 or max(acc.values()) > 0.999999
    with pytest.raises(config_tools.ConfigError, match="early_stop_accuracy"):
        loop.train(tiny_config(**{"train.early_stop_accuracy": 99.0}), str(tmp_path / "bad"))


def test_load_for_eval_rebuilds_random_features_with_the_runs_prng(tmp_path):
    """A model's non-parameter draws (Performer's omega, which checkpoints do not hold)
    come from the run's seed through train.prng_impl: a run keyed by unsafe_rbg, loaded
    for evaluation, must draw the omega it trained and evaluated with, so its loss is
    the loop's final eval loss (it was 4.8 against 1.7 on tiny-Shakespeare when the
    loader drew omega with threefry)."""
    kw = {"model.mixer": "performer", "model.performer_redraw_every": 0,
          "train.prng_impl": "unsafe_rbg"}
    result = loop.train(tiny_config(**kw), str(tmp_path))
    model, config, dataset, _ = checkpoint.load_for_eval(tmp_path)
    with jax.default_prng_impl("unsafe_rbg"):
        trained_omega = builders.model_factory(
            builders.build_model_config(config, dataset), config.train.seed)().blocks[0]
    np.testing.assert_array_equal(model.blocks[0].mixer.omega[...],
                                  trained_omega.mixer.omega[...])
    total = np.zeros(3)
    for b in dataset.eval_batches(config.train.batch_size, config.train.eval_batches):
        total += np_masked_xent(model(b["inputs"], segment_ids=b["segment_ids"]),
                                b["targets"], b["mask"])
    assert result["eval_loss"] == pytest.approx(total[0] / total[1], rel=1e-5)
    assert str(jax.random.key(0).dtype) == "key<fry>"  # the process default is kept


def test_mfu_against_a_given_peak(tmp_path, capsys):
    """train.peak_flops gives the peak MFU is reported against: each logged MFU is that
    entry's tokens/s times the model's training FLOPs a token over the peak. Without it a
    CPU run reports none and its banner says why."""
    from training import flops as train_flops
    kw = {"train.steps": 4, "train.log_every": 2, "train.checkpoint_every": 0,
          "logging.progress": False}
    loop.train(tiny_config(**kw, **{"train.peak_flops": 1e9}), str(tmp_path / "peak"))
    config = tiny_config()
    dataset = builders.build_dataset(config)
    model_cfg = builders.build_model_config(config, dataset)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(
        builders.model_factory(model_cfg, 0)(), nnx.Param)))
    per_token = train_flops.train_flops_per_token(n_params, model_cfg.to_dict(),
                                                  config.data.seq_len)
    logged = [e for e in metrics.read_metrics(tmp_path / "peak") if "loss" in e]
    assert [e["step"] for e in logged] == [1, 2, 4]
    for e in logged:
        assert e["mfu"] == pytest.approx(e["tokens_per_s"] * per_token / 1e9, rel=1e-9)
    shown = capsys.readouterr().out
    assert "mfu" in shown and "MFU not reported" not in shown
    loop.train(tiny_config(**kw), str(tmp_path / "cpu"))
    shown = capsys.readouterr()
    assert "MFU not reported" in shown.out + shown.err and "mfu" not in shown.out
    assert all("mfu" not in e for e in metrics.read_metrics(tmp_path / "cpu"))
