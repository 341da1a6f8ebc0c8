"""Issue 21's scale check (slow: 5 minutes and 12 GB of disk on the loaded 2 cores): 2.3 GB of
generated text prepares into a store, a preparation SIGKILLed mid-way and run again
gives the store an uninterrupted one gives, and train.py trains on it with its resident
memory under 2 GB."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from data import store as st
from tests.training.conftest import ROOT, env

pytestmark = pytest.mark.slow

GB = 1 << 30


def write_corpus(directory, total_bytes: int, n_files: int = 64, seed: int = 0) -> None:
    """Files of paragraphs drawn from a pool of 20,000 random ones (fast to write)."""
    rng = np.random.default_rng(seed)
    words = np.array("the of and to in is was for on that with as by at from his her it "
                     "an were are which this be or had not but been their one all has "
                     "éa γράμμα 日本語 naïve".split())
    pool = [" ".join(words[rng.integers(0, len(words), rng.integers(20, 400))])
            for _ in range(20_000)]
    directory.mkdir(parents=True)
    per_file = total_bytes // n_files
    for f in range(n_files):
        picks, size = [], 0
        while size < per_file:
            idx = rng.integers(0, len(pool), 4096)
            picks.extend(pool[i] for i in idx)
            size += sum(len(pool[i].encode()) + 2 for i in idx)
        (directory / f"part_{f:02d}.txt").write_text("\n\n".join(picks), encoding="utf-8")


def prepare_args(corpus, out):
    return [sys.executable, "-m", "data.prepare", f"--files={corpus / '*.txt'}",
            f"--out={out}", "--sample_by=paragraph", "--shard_tokens=67108864", "--no_progress"]


def test_two_gigabytes_prepare_resume_after_sigkill_and_train_under_2gb(tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, int(2.1 * GB))
    text_bytes = sum(p.stat().st_size for p in corpus.iterdir())
    assert text_bytes >= 2 * GB

    ref = subprocess.run(prepare_args(corpus, tmp_path / "ref"), cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr

    out = tmp_path / "killed"
    proc = subprocess.Popen(prepare_args(corpus, out), cwd=ROOT, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not (out / "shard_00005.json").exists():
        assert proc.poll() is None and time.time() - t0 < 900
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / st.MANIFEST).exists()
    again = subprocess.run(prepare_args(corpus, out), cwd=ROOT, env=env(),
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr
    # Equal manifests hold equal shard sha256s; the files are checked against them.
    assert (out / st.MANIFEST).read_bytes() == (tmp_path / "ref" / st.MANIFEST).read_bytes()
    _, manifest = st.load_manifest(out)
    for rec in manifest["shards"]:
        st.open_shard(out, rec, np.dtype(manifest["dtype"]), verify=True)
    # Byte tokens: every byte of the files but the "\n\n" between paragraphs, plus one
    # EOD per paragraph (none is empty).
    assert manifest["tokens"] == text_bytes - 2 * (manifest["documents"] - 64) \
        + manifest["documents"]

    train = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), f"--config={ROOT / 'configs/lm_files.py'}",
         f"--workdir={tmp_path / 'run'}", "--config.data.source=store",
         f"--config.data.store={out}", "--config.train.steps=30",
         "--config.model.num_layers=2", "--config.model.d_model=64",
         "--config.train.batch_size=8", "--config.train.eval_every=0",
         "--config.train.checkpoint_every=0", "--config.logging.wandb=disabled",
         "--config.logging.progress=False"],
        cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(train.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, train.stderr.read().decode()[-2000:]
    assert usage.ru_maxrss * 1024 < 2 * GB, f"peak resident {usage.ru_maxrss / 1024:.0f} MiB"

