"""Checkpoints across scan_layers: an unrolled run's checkpoint resumes scanned through
the training loop with the losses of the run that never stopped (dropout on: the masks
are the unrolled layers' own), and a scanned checkpoint loads for eval unrolled.

The reference is one uninterrupted unrolled run; the resumed run starts from a copy of
its workdir cut back to the step-4 checkpoint (what a kill after step 4 leaves)."""
import json
import shutil

import numpy as np
import pytest

from tests.training.conftest import tiny_config
from training import checkpoint, loop, metrics

KW = {"model.dropout": 0.1, "model.num_layers": 2, "train.steps": 8}


def losses(workdir):
    return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}


def test_unrolled_checkpoint_resumes_scanned_and_scanned_loads_unrolled(tmp_path):
    ref = tmp_path / "unrolled"
    loop.train(tiny_config(**KW, **{"model.scan_layers": False}), str(ref))
    resumed = tmp_path / "resumed"
    shutil.copytree(ref, resumed)
    shutil.rmtree(resumed / checkpoint.CHECKPOINT_DIR / "8")
    result = loop.train(tiny_config(**KW, **{"model.scan_layers": True}), str(resumed))

    want, got = losses(ref), losses(resumed)
    assert sorted(got) == list(range(1, 9))
    for step in range(5, 9):  # parameters, Adam moments and dropout masks carried over
        assert got[step] == pytest.approx(want[step], rel=2e-6, abs=2e-6), step
    ckpt = checkpoint.Checkpointer(resumed, async_save=False)
    try:
        names = set(ckpt.param_shapes(8))
    finally:
        ckpt.close()
    assert any(n.startswith("scan_blocks/0/") for n in names)
    assert not any(n.startswith("blocks/") for n in names)

    # The stacked step-8 checkpoint read by an unrolled model (eval's loader).
    config_file = resumed / "config.json"
    saved = json.loads(config_file.read_text())
    saved["model"]["scan_layers"] = False
    config_file.write_text(json.dumps(saved))
    model, config, dataset, step = checkpoint.load_for_eval(resumed)
    assert step == 8 and model.scan is None
    total = np.zeros(2)
    for b in dataset.eval_batches(config.train.batch_size, config.train.eval_batches):
        logits = np.asarray(model(b["inputs"], segment_ids=b["segment_ids"]), np.float64)
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) \
            + logits.max(-1)
        nll = logz - np.take_along_axis(logits, b["targets"][..., None], -1)[..., 0]
        total += [(nll * b["mask"]).sum(), b["mask"].sum()]
    assert result["eval_loss"] == pytest.approx(total[0] / total[1], rel=1e-5)
