"""eval.speed times train.py's own step on the data pipeline's batches."""
import numpy as np

from tests.eval.conftest import corpus_text


def _config(corpus):
    """configs/base.py at a tiny softmax model on `corpus` split into one document per
    line, so rows hold several documents and their segment ids differ."""
    from training import config_tools
    from tests.eval.conftest import ROOT

    config = config_tools.load_config_file(str(ROOT / "configs" / "base.py"))
    config.data.files = str(corpus)
    config.data.sample_by = "line"
    config.model.update(dict(d_model=16, num_heads=2, num_layers=1, mlp=False))
    return config


def test_train_speed_times_the_training_step_on_pipeline_batches(tmp_path, monkeypatch):
    import data
    from eval import speed
    from training import sharding, step

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(200))
    config = _config(corpus)
    made, traced, fed = [], [], []
    real_make, real_global = step.make_train_step, sharding.global_batch

    def counting_make(*args, **kwargs):
        made.append(args)
        inner = real_make(*args, **kwargs)

        def traced_step(params, opt_state, batch, *keys):
            traced.append({k: tuple(v.shape) for k, v in batch.items()})
            return inner(params, opt_state, batch, *keys)
        return traced_step

    def recording_global(batch, sharding_):
        fed.append({k: np.asarray(v) for k, v in batch.items()})
        return real_global(batch, sharding_)

    monkeypatch.setattr(step, "make_train_step", counting_make)
    monkeypatch.setattr(sharding, "global_batch", recording_global)
    out = speed.measure(config, train_lengths=(16, 32), train_batch=2, train_steps=2,
                        log=lambda _: None)

    assert [c for c in out["train"].values() if "error" in c] == []
    assert len(made) == 2                             # one train step built per length
    keys = ("inputs", "targets", "mask", "segment_ids")
    assert traced == [{k: (2, n) for k in keys} for n in (16, 32)]  # traced once each
    for n in (16, 32):
        cell = out["train"][str(n)]
        assert cell["tokens_per_s"] == 2 * n / cell["step_s"] and np.isfinite(cell["loss"])
    # The batches are the pipeline's: step s's batch of the run's dataset at that length,
    # a warm-up and two timed steps per length, documents kept apart by segment ids.
    assert len(fed) == 6
    for i, n in enumerate((16, 32)):
        c = speed.at_shape(config, 2, n)
        dataset = data.build(c.data.to_dict(), seed=int(c.train.seed))
        for s in range(3):
            want = dataset.batch(s, 2)
            got = fed[3 * i + s]
            assert set(got) == set(want)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
    assert any(len(np.unique(b["segment_ids"])) > 1 for b in fed)
    assert out["params"] > 0 and out["decode"] == {}
