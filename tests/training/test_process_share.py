"""Two CPU processes (jax.distributed on localhost, one device each) training on a token
store, each reading only its half of every global batch, give losses bitwise equal to one
process with two devices on the same global batches; SIGKILL of either process mid-run
and the same command run again on both resume to the same losses, bitwise.

Slow: 100-130 s on the 2 cores; the two-process steps go through gloo, whose
collectives slow down many times over when other work starves the cores (6 and 11
minutes measured under a load of 10, once past the tests' 600 s limits). The share arithmetic and each source's rows are checked fast in
tests/data/test_process_share.py.
"""
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from data import prepare as prep
from tests.data.test_store import write_corpus
from tests.training.conftest import ROOT, TINY, env
from tests.training.test_distributed import _free_port
from training import metrics

pytestmark = pytest.mark.slow

BATCH = 8
STEPS = 30


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_processes")
    write_corpus(root / "text")
    prep.prepare(str(root / "text" / "*.txt"), root / "store", sample_by="paragraph",
                 shard_tokens=3000, progress=False)
    return root


def command(store_root: pathlib.Path, workdir: pathlib.Path) -> list[str]:
    """train.py (through the launcher that records the store's reads) on the store."""
    over = dict(TINY, **{"data.source": "store", "data.store": str(store_root / "store"),
                         "data.seq_len": 32, "train.steps": STEPS,
                         "train.checkpoint_every": 10, "train.batch_size": BATCH,
                         "train.eval_batches": 1, "model.mlp": True})
    return ([sys.executable, str(ROOT / "tests" / "training" / "share_launcher.py"),
             "--config=" + str(ROOT / "configs" / "mqar.py"), f"--workdir={workdir}"]
            + [f"--config.{k}={v}" for k, v in over.items()])


def losses(workdir) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in metrics.read_metrics(workdir) if "loss" in e}


def start_two(store_root, workdir, log, port):
    return [subprocess.Popen(command(store_root, workdir), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=env(JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                                     JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
                                     SHARE_LOG=str(log)))
            for i in range(2)]


def finish(procs, timeout=600) -> list[tuple[str, str]]:
    """Both processes' (stdout, stderr); past `timeout` both are killed and the test fails
    with what each printed (a hang in one shows where the other waited)."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = [p.communicate()[1][-2000:] for p in procs]
        pytest.fail("a process hung; their stderr:\n" + "\n---\n".join(tails))


def reads(log: pathlib.Path, process: int) -> list[dict]:
    path = log.with_name(f"{log.name}.{process}")
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_each_read_its_half(log: pathlib.Path) -> None:
    """Every training read of process p asked for its rows of the batch only."""
    for p in (0, 1):
        train = [r for r in reads(log, p) if r["split"] == "train"]
        assert train, p
        half = list(range(p * BATCH // 2, (p + 1) * BATCH // 2))
        for r in train:
            assert r["method"] == "batch_rows" and r["rows"] == half, (p, r)


@pytest.fixture(scope="module")
def one_process(store):
    """The reference: one process, two devices, the same mesh and global batches."""
    work = store / "one"
    r = subprocess.run(command(store, work), cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env(XLA_FLAGS="--xla_force_host_platform_device_count=2",
                                            SHARE_LOG=str(store / "log_one")))
    assert r.returncode == 0, r.stderr[-3000:]
    want = losses(work)
    assert sorted(want) == list(range(1, STEPS + 1))
    # one process reads whole batches
    assert all(x["method"] == "batch" for x in reads(store / "log_one", 0)
               if x["split"] == "train")
    return want


def test_two_processes_reading_their_halves_match_one_process_bitwise(store, one_process):
    work, log = store / "two", store / "log_two"
    procs = start_two(store, work, log, _free_port())
    outs = finish(procs)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "over 2 cpu device(s)" in outs[0][1]
    assert losses(work) == one_process  # bitwise: float equality of every step's loss
    assert_each_read_its_half(log)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_kill_of_either_process_resumes_to_the_same_losses(store, one_process, victim):
    work, log = store / f"killed{victim}", store / f"log_killed{victim}"
    procs = start_two(store, work, log, _free_port())
    try:
        deadline = time.time() + 600
        while max(losses(work) if (work / "metrics.jsonl").exists() else {}, default=0) < 15:
            assert time.time() < deadline, "step 15 not reached in 600 s (a starved CPU?)"
            assert all(p.poll() is None for p in procs), \
                [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        procs[victim].send_signal(signal.SIGKILL)
        killed_at = max(losses(work))
        assert killed_at < STEPS
        # The survivor is stuck in the next collective until the coordination service's
        # heartbeat gives up (100 s); a scheduler would take the job down: so does this.
        time.sleep(2)
        procs[1 - victim].send_signal(signal.SIGKILL)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[victim].returncode == -signal.SIGKILL

    # The same command on both processes again.
    shutil.move(str(log) + ".0", str(log) + ".first0")
    shutil.move(str(log) + ".1", str(log) + ".first1")
    procs = start_two(store, work, log, _free_port())
    outs = finish(procs)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    resumed = [line for line in outs[0][1].splitlines() if "resuming from step" in line]
    assert resumed and 0 < int(resumed[0].rsplit(" ", 1)[1]) <= killed_at, outs[0][1][-2000:]
    assert losses(work) == one_process
    assert_each_read_its_half(log)
