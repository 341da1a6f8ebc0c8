"""Training with each sequence split along time (mesh.sequence, context parallelism):
the losses of a run over 8 simulated CPU devices with mesh.sequence = 4 (and data = 2)
equal those of the one-device run (mesh.sequence = 1) within 1e-5, on packed documents
(a byte LM on several small files: end-of-document ids, so the states reset inside
pieces and across their boundaries) through a gated DeltaNet + softmax hybrid; and the
mesh settings that cannot work are refused by name."""
import json
import subprocess
import sys

import pytest

from tests.training.conftest import ROOT, env
from tests.training.test_distributed import assert_close
from training import config_tools, loop, metrics, runtime
from training import sharding as shd

MODEL = {
    "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2,
    "model.mixer": "gated_deltanet", "model.layer_pattern": "gated_deltanet,softmax",
    "model.chunk_size": 4, "model.max_len": 32,
    "data.seq_len": 32, "data.tokenizer": "byte",
    "train.steps": 8, "train.batch_size": 8, "train.lr": 3e-3, "train.warmup_steps": 2,
    "train.log_every": 1, "train.eval_every": 4, "train.eval_batches": 1,
    "train.checkpoint_every": 0, "logging.wandb": "disabled", "logging.progress": False,
}

SCRIPT = """
import json, sys
from kernels import context_parallel as cp
from tests.training.test_sequence_parallel import config, losses
from training import loop
corpus, root, meshes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
splits, shard_map = [], cp._shard_map   # count the mixers' splits while tracing
cp._shard_map = lambda *a, **k: (splits.append(a[1].shape["sequence"]), shard_map(*a, **k))[1]
out = {}
for name, mesh in meshes.items():
    splits.clear()
    loop.train(config(corpus, **mesh), f"{root}/{name}")
    out[name + "/splits"] = list(splits)
    out[name] = losses(f"{root}/{name}")
    out[name + "/eval"] = losses(f"{root}/{name}", "eval_loss")
print("LOSSES" + json.dumps(out))
"""


def write_corpus(directory):
    """Twelve short documents of different lengths (5 to 70 bytes): packed rows of 32
    tokens hold several, their boundaries anywhere in the 8-token pieces."""
    import random
    rng = random.Random(0)
    words = "the a state passes between devices while documents reset at their ends".split()
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(12):
        n = rng.randint(1, 14)
        (directory / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words)
                                                            for _ in range(n)))
    return str(directory / "*.txt")


def config(corpus, **mesh):
    c = config_tools.load_config_file(str(ROOT / "configs" / "lm_files.py"))
    config_tools.set_values(c, dict(MODEL, **{"data.files": corpus},
                                    **{f"mesh.{k}": v for k, v in mesh.items()}))
    return c


def losses(workdir, key="loss"):
    return {e["step"]: e[key] for e in metrics.read_metrics(workdir) if key in e}


def one_device_then_meshes(tmp_path, meshes):
    """The one-device run in this process, then the same config on each of `meshes`
    (name -> mesh sizes) in one subprocess over 8 simulated devices: the one-device
    losses and the subprocess's {name: losses, name/eval: ..., name/splits: ...}."""
    corpus = write_corpus(tmp_path / "docs")
    loop.train(config(corpus), str(tmp_path / "one"))
    r = subprocess.run([sys.executable, "-c", SCRIPT, corpus, str(tmp_path),
                        json.dumps(meshes)], cwd=ROOT, capture_output=True, text=True,
                       timeout=900,
                       env=env(XLA_FLAGS="--xla_force_host_platform_device_count=8"))
    assert r.returncode == 0, r.stderr[-3000:]
    return losses(tmp_path / "one"), json.loads(r.stdout.split("LOSSES", 1)[1])


def test_sequence_split_training_matches_one_device(tmp_path):
    want, out = one_device_then_meshes(tmp_path, {"seq4": {"data": 2, "sequence": 4}})
    want_eval = losses(tmp_path / "one", "eval_loss")
    assert len(want) == MODEL["train.steps"] and len(want_eval) == 2
    assert_close({int(k): v for k, v in out["seq4"].items()}, want)
    assert_close({int(k): v for k, v in out["seq4/eval"].items()}, want_eval)
    # the run was split: every layer's op and short convs, in the train and eval steps
    # (the q/k/v convs as one stacked conv + the delta rule, the softmax layer; twice)
    assert out["seq4/splits"] == [4] * 6, out["seq4/splits"]
    saved = json.loads((tmp_path / "seq4" / "config.json").read_text())
    assert saved["mesh"]["sequence"] == 4


@pytest.mark.slow
def test_sequence_over_8_and_beside_fsdp_and_tensor(tmp_path):
    """mesh.sequence = 8 alone, and sequence 2 x fsdp 2 x tensor 2 (measured: 8.2e-7 and
    3.1e-7 of the one-device losses; mesh.sequence = 4 above, 5.1e-7)."""
    want, out = one_device_then_meshes(tmp_path, {
        "seq8": {"data": 1, "sequence": 8},
        "mixed": {"data": 1, "fsdp": 2, "tensor": 2, "sequence": 2}})
    for name, n in (("seq8", 8), ("mixed", 2)):
        assert out[name + "/splits"] == [n] * 6, (name, out[name + "/splits"])
        assert_close({int(k): v for k, v in out[name].items()}, want)


def test_batch_is_split_along_time():
    mesh = shd.make_mesh(-1, 1, 1)
    assert mesh.axis_names == ("data", "fsdp", "tensor", "sequence")
    assert mesh.shape["sequence"] == 1
    assert shd.batch_spec(mesh) == shd.P(("data", "fsdp"))

    class Seq4:
        shape = {"data": 2, "fsdp": 1, "tensor": 1, "sequence": 4}
    assert shd.batch_spec(Seq4) == shd.P(("data", "fsdp"), "sequence")
    assert shd.batch_spec(Seq4, (None,)) == shd.P(None, ("data", "fsdp"), "sequence")


def test_impossible_sequence_meshes_are_refused(tmp_path):
    corpus = write_corpus(tmp_path / "docs")
    with pytest.raises(shd.MeshError, match="mesh.sequence=2 must be a positive divisor"):
        runtime.make_mesh(config(corpus, sequence=2))   # one device here
    with pytest.raises(shd.MeshError, match="mesh.sequence=0"):
        shd.make_mesh(sequence=0)

    class Seq4:
        shape = {"data": 1, "fsdp": 1, "tensor": 1, "sequence": 4}
    with pytest.raises(shd.MeshError, match="data.seq_len=30 must be a multiple of "
                                            "mesh.sequence = 4"):
        shd.check_sequence_divides(30, Seq4)
