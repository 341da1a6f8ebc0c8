"""The token store: `python -m data.prepare` against plain UTF-8 encoding, resumption,
the bad-store messages, batches equal to the in-memory path's, prefetch, and a
training run on data.source=store that resumes bitwise (about 25 s on 2 cores, most of
it the run's compile)."""
import hashlib
import json
import pathlib
import random
import shutil

import numpy as np
import pytest

import data
from data import prepare as prep
from data import store as st
from data.prefetch import Prefetched

EOD = 256  # the byte tokenizer's 256 ids, then the end-of-document id


def write_corpus(directory: pathlib.Path, n_files: int = 4, seed: int = 0) -> list[pathlib.Path]:
    """Files of paragraphs (blank-line separated) with multi-byte characters."""
    rng = random.Random(seed)
    words = ["alpha", "béta", "γάμμα", "delta", "ε", "日本", "x", "yz\n"]
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(n_files):
        paras = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 120)))
                 for _ in range(rng.randint(8, 20))]
        path = directory / f"part_{f}.txt"
        path.write_text("\n\n".join(paras), encoding="utf-8")
        paths.append(path)
    return paths


def reference_documents(paths) -> list[list[int]]:
    """Independent of the repo: each file's paragraphs as their UTF-8 bytes."""
    docs = []
    for p in sorted(paths):
        for para in p.read_bytes().split(b"\n\n"):
            if para:
                docs.append(list(para))
    return docs


def store_files(directory: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    paths = write_corpus(root / "text")
    out = root / "store"
    manifest = prep.prepare(str(root / "text" / "*.txt"), out, sample_by="paragraph",
                            shard_tokens=3000, progress=False)
    return root, paths, out, manifest


def test_store_holds_the_utf8_bytes_of_every_paragraph(corpus):
    root, paths, out, manifest = corpus
    ref = reference_documents(paths)
    got = []
    for rec in manifest["shards"]:
        tokens = np.load(out / rec["tokens_file"], mmap_mode="r")
        offsets = np.load(out / rec["offsets_file"], mmap_mode="r")
        assert tokens.dtype == np.uint16 and offsets[0] == 0 and offsets[-1] == len(tokens)
        for a, b in zip(offsets[:-1], offsets[1:]):
            assert tokens[b - 1] == EOD
            got.append(tokens[a:b - 1].tolist())
        assert rec["tokens_sha256"] == hashlib.sha256(
            (out / rec["tokens_file"]).read_bytes()).hexdigest()
    assert got == ref
    assert manifest["documents"] == len(ref)
    assert manifest["tokens"] == sum(len(d) + 1 for d in ref)
    assert manifest["num_shards"] == len(manifest["shards"]) > 3
    assert json.loads((out / st.TOKENIZER).read_text()) == {"kind": "byte"}
    assert manifest["tokenizer"]["name"] == "byte" and manifest["eod_id"] == EOD
    # Only the finished store's files are left.
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("shard_")) == [
        "manifest.json", "tokenizer.json"]


def test_char_store_ids_index_the_sorted_characters(tmp_path):
    paths = write_corpus(tmp_path / "text", n_files=2, seed=1)
    m = prep.prepare(str(tmp_path / "text" / "*.txt"), tmp_path / "s", tokenizer="char",
                     progress=False)
    text = [p.read_text(encoding="utf-8") for p in sorted(paths)]
    chars = sorted(set("".join(text)))
    tokens = np.concatenate([np.load(tmp_path / "s" / r["tokens_file"]) for r in m["shards"]])
    eod = len(chars)
    want = []
    for t in text:  # sample_by=document: one document per file
        want += [chars.index(c) for c in t] + [eod]
    assert tokens.tolist() == want and m["eod_id"] == eod


def test_stopped_or_damaged_preparation_resumes_to_the_same_bytes(corpus, tmp_path):
    root, _, full, _ = corpus
    want = store_files(full)
    glob = str(root / "text" / "*.txt")
    kw = dict(sample_by="paragraph", shard_tokens=3000, progress=False)

    out = tmp_path / "stopped"
    assert prep.prepare(glob, out, max_shards=2, **kw) is None  # as if killed
    assert not (out / st.MANIFEST).exists()
    assert sorted(p.name for p in out.glob("shard_*.json")) == ["shard_00000.json",
                                                               "shard_00001.json"]
    assert prep.prepare(glob, out, max_shards=1, **kw) is None  # killed again, later
    # What a kill mid-write leaves (a tmp file) and a damaged last finished shard.
    (out / "shard_00003.tokens.npy.tmp").write_bytes(b"\0" * 100)
    last = out / "shard_00002.tokens.npy"
    last.write_bytes(last.read_bytes()[:-10])
    prep.prepare(glob, out, **kw)
    assert store_files(out) == want

    # Rerun on the finished store: checked, nothing rewritten.
    assert prep.prepare(glob, out, **kw)["tokens"] == json.loads(want["manifest.json"])["tokens"]
    assert store_files(out) == want
    with pytest.raises(st.StoreError, match="other settings.*shard_tokens"):
        prep.prepare(glob, out, **dict(kw, shard_tokens=999))


def test_prepare_cli_writes_the_same_store(corpus, tmp_path):
    root, _, full, _ = corpus
    rc = prep.main([f"--files={root / 'text' / '*.txt'}", f"--out={tmp_path / 's'}",
                    "--sample_by=paragraph", "--shard_tokens=3000", "--no_progress"])
    assert rc == 0 and store_files(tmp_path / "s") == store_files(full)


def copy_store(corpus, tmp_path) -> pathlib.Path:
    out = tmp_path / "store"
    shutil.copytree(corpus[2], out)
    return out


def build_store(path, **kw):
    return data.build(dict({"source": "store", "store": str(path), "seq_len": 32}, **kw), seed=0)


def test_bad_stores_are_named_in_one_message(corpus, tmp_path):
    out = copy_store(corpus, tmp_path)
    build_store(out)  # intact

    with pytest.raises(ValueError, match="made with tokenizer 'byte', but the config asks "
                                         "for data.tokenizer='char'"):
        build_store(out, tokenizer="char")

    (out / "shard_00001.tokens.npy").rename(out / "moved.npy")
    with pytest.raises(st.StoreError, match="shard_00001.tokens.npy is missing"):
        build_store(out)
    (out / "moved.npy").rename(out / "shard_00001.tokens.npy")

    path = out / "shard_00002.tokens.npy"
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[-5] ^= 1
    path.write_bytes(bytes(flipped))
    with pytest.raises(st.StoreError, match="shard_00002.tokens.npy is damaged: its sha256"):
        build_store(out)
    path.write_bytes(good[:-6])
    with pytest.raises(st.StoreError, match="shard_00002.tokens.npy is damaged"):
        build_store(out, verify_store=False)  # the length is checked even unhashed
    path.write_bytes(good)

    manifest = json.loads((out / st.MANIFEST).read_text())
    (out / st.MANIFEST).write_text(json.dumps(dict(manifest, tokens=manifest["tokens"] + 1)))
    with pytest.raises(st.StoreError, match="does not match itself: it counts"):
        build_store(out)
    shards = [dict(s, tokens=s["tokens"] + (i == 0)) for i, s in enumerate(manifest["shards"])]
    (out / st.MANIFEST).write_text(json.dumps(dict(manifest, shards=shards,
                                                   tokens=manifest["tokens"] + 1)))
    with pytest.raises(st.StoreError, match="does not match the manifest"):
        build_store(out)
    (out / st.MANIFEST).unlink()
    with pytest.raises(st.StoreError, match="has no manifest.json"):
        build_store(out)
    with pytest.raises(st.StoreError, match="does not exist; make it with python -m data.prepare"):
        build_store(tmp_path / "nowhere")


@pytest.mark.parametrize("packing", ["random_windows", "rows"])
def test_store_batches_equal_the_in_memory_path(corpus, packing):
    root, _, out, _ = corpus
    common = {"seq_len": 32, "packing": packing, "val_fraction": 0.2}
    mem = data.build(dict(common, source="files", files=str(root / "text" / "*.txt"),
                          sample_by="paragraph"), seed=5)
    disk = data.build(dict(common, source="store", store=str(out)), seed=5)
    assert disk.vocab_size == mem.vocab_size == EOD + 1 and disk.packed and mem.packed
    # Rows cross shard boundaries (3,000 tokens each) and, for rows, epochs (wrapping).
    for step in [0, 1, 7, 2, 40, 3]:
        a, b = mem.batch(step, 12), disk.batch(step, 12)
        for k in data.BATCH_KEYS:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{k} step {step}")
    ea, eb = list(mem.eval_batches(8)), list(disk.eval_batches(8))
    assert len(ea) == len(eb) > 2
    for a, b in zip(ea, eb):
        for k in data.BATCH_KEYS:
            np.testing.assert_array_equal(a[k], b[k])
    assert len(list(disk.eval_batches(8, num_batches=2))) == 2


def test_prefetch_changes_no_batch_whatever_the_order(corpus):
    out = corpus[2]
    plain = build_store(out, prefetch=0)
    ahead = build_store(out, prefetch=3)
    again = build_store(out, prefetch=1)
    assert isinstance(ahead, Prefetched) and not isinstance(plain, Prefetched)
    for step in [0, 1, 2, 3, 10, 11, 4, 5, 5, 12]:  # in order, jumps, a repeat
        want = plain.batch(step, 6)
        for other in (ahead, again):
            got = other.batch(step, 6)
            for k in data.BATCH_KEYS:
                np.testing.assert_array_equal(want[k], got[k])
    # Segment ids restart after each EOD; every row starts at segment 1.
    b = plain.batch(9, 6)
    assert (b["segment_ids"][:, 0] == 1).all()
    np.testing.assert_array_equal(np.diff(b["segment_ids"], axis=1),
                                  (b["inputs"][:, 1:] == EOD).astype(np.int32))
    ahead.close()


def test_training_on_the_store_resumes_bitwise(corpus, tmp_path):
    from tests.training.conftest import tiny_config
    from training import checkpoint, loop, metrics

    root, _, out, _ = corpus
    common = {"train.steps": 3, "train.checkpoint_every": 2, "train.batch_size": 4,
              "data.seq_len": 32, "data.val_fraction": 0.2, "data.packing": "rows",
              "train.eval_batches": 1}

    def losses(work):
        return {e["step"]: e["loss"] for e in metrics.read_metrics(work) if "loss" in e}

    store_run = tmp_path / "store"
    loop.train(tiny_config(**common, **{"data.source": "store", "data.store": str(out)}),
               str(store_run))
    want = losses(store_run)  # its batches are the in-memory path's (tested above)
    assert sorted(want) == [1, 2, 3] and all(np.isfinite(v) for v in want.values())

    # Drop the newest checkpoint (3): the rerun resumes at step 2 and redoes step 3.
    shutil.rmtree(store_run / checkpoint.CHECKPOINT_DIR / "3")
    (store_run / "metrics.jsonl").write_text("")
    result = loop.train(tiny_config(**common, **{"data.source": "store", "data.store": str(out),
                                                 "data.prefetch": 0}), str(store_run))
    assert result["step"] == 3
    assert losses(store_run) == {3: want[3]}


def test_rows_visit_each_epochs_permutation_of_the_stream(corpus):
    """packing=rows against numpy's generator directly: row r of epoch e starts at
    perm_e[r] * T with perm_e = default_rng([seed, e, 1]).permutation(n_rows)."""
    out, manifest = corpus[2], corpus[3]
    stream = np.concatenate([np.load(out / r["tokens_file"]) for r in manifest["shards"]])
    T, seed = 32, 4
    ds = data.build({"source": "store", "store": str(out), "packing": "rows",
                     "val_fraction": 0.2, "seq_len": T}, seed=seed)
    n_rows = (int(len(stream) * 0.8) - 1) // T
    B = n_rows // 3 + 1  # batches cross epoch ends
    for step in [0, 1, 2, 3, 7, 5]:
        flat = step * B + np.arange(B)
        want = []
        for e, r in zip(flat // n_rows, flat % n_rows):
            start = np.random.default_rng([seed, int(e), 1]).permutation(n_rows)[r] * T
            want.append(stream[start:start + T])
        np.testing.assert_array_equal(ds.batch(step, B)["inputs"], np.stack(want))


def test_hub_dataset_streams_into_a_store_equal_to_the_in_memory_hf_path(tmp_path):
    """A local folder of JSON-lines files read as a hub dataset (offline), streamed."""
    rng = random.Random(2)
    texts = []
    (tmp_path / "hub").mkdir()
    for f in range(2):
        rows = [" ".join(rng.choice(["ab", "çd", "e", "日"]) for _ in range(rng.randint(0, 60)))
                for _ in range(30)]
        texts += rows
        (tmp_path / "hub" / f"part{f}.jsonl").write_text(
            "".join(json.dumps({"body": t}) + "\n" for t in rows))
    out = tmp_path / "store"
    kw = dict(hf_name=str(tmp_path / "hub"), text_field="body", shard_tokens=500,
              progress=False)
    assert prep.prepare(None, out, max_shards=1, **kw) is None
    m = prep.prepare(None, out, **kw)
    tokens = np.concatenate([np.load(out / r["tokens_file"]) for r in m["shards"]])
    want = [b for t in texts if t for b in list(t.encode("utf-8")) + [EOD]]
    assert tokens.tolist() == want and m["num_shards"] > 2
    common = {"seq_len": 16, "packing": "rows", "text_field": "body"}
    mem = data.build(dict(common, source="hf", name=str(tmp_path / "hub")), seed=1)
    disk = data.build(dict(common, source="store", store=str(out)), seed=1)
    for step in range(4):
        a, b = mem.batch(step, 8), disk.batch(step, 8)
        for k in data.BATCH_KEYS:
            np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match="either --files"):
        prep.prepare(None, tmp_path / "x", progress=False)


def test_sigkilled_prepare_resumes_to_the_same_bytes(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.training.conftest import ROOT, env

    write_corpus(tmp_path / "text", n_files=40, seed=3)
    args = [sys.executable, "-m", "data.prepare", f"--files={tmp_path / 'text' / '*.txt'}",
            "--shard_tokens=1500", "--no_progress"]
    ref = subprocess.run(args + [f"--out={tmp_path / 'ref'}"], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen(args + [f"--out={out}"], cwd=ROOT, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not (out / "shard_00003.json").exists() and proc.poll() is None:
        assert time.time() - t0 < 120
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if (out / st.MANIFEST).exists():
        pytest.skip("the preparation finished before the kill landed")
    again = subprocess.run(args + [f"--out={out}"], cwd=ROOT, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert store_files(out) == store_files(tmp_path / "ref")


@pytest.mark.parametrize("sample_by", ["paragraph", "line"])
def test_files_read_in_chunks_split_as_the_whole_text(tmp_path, sample_by):
    """Separators cut by a chunk end ("\\n|\\n", "\\r|\\n") split as str.split("\\n\\n") /
    str.splitlines() of the whole file read by pathlib (data.sources' reader)."""
    from data.sources import _split_plain

    rng = random.Random(7)
    alphabet = ["a", "b", "\n", "\n", "\r", "\r\n", "\u2028", "é", "\x0c", " "]
    path = tmp_path / "f.txt"
    for _ in range(150):
        path.write_bytes("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50))).encode())
        want = [d for d in _split_plain(path.read_text(encoding="utf-8"), sample_by) if d]
        for chunk in (1, 2, 5, 1000):
            assert list(prep.iter_documents([str(path)], sample_by, chunk_chars=chunk)) == want


def test_store_keys_are_checked_before_anything_runs():
    from tests.training.conftest import tiny_config
    from training import config_tools

    for over, message in [({"data.source": "store"}, "needs data.store=PATH"),
                          ({"data.source": "store", "data.store": "s", "data.prefetch": -1},
                           "data.prefetch=-1: use a number of batches >= 0")]:
        with pytest.raises(config_tools.ConfigError, match=message):
            config_tools.check_config(tiny_config(**over))
