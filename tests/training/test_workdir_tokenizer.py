"""Self-contained workdirs: the run's tokenizer is saved in WORKDIR/tokenizer.json when it
starts, evaluation and generation use it (and refuse text it does not fit, naming the
file and line), a resume on data with another tokenizer is refused; invalid UTF-8 names
the file and line, and data.encoding_errors=replace reads it.

One tiny char-level run (about 10 s on 2 cores, its compile) serves the module."""
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

from data import prepare as prep
from data import sources
from data import tokenizers as toks
from tests.training.conftest import ROOT, run_cli, tiny_config
from training import loop, workdir_tokenizer as wt

TEXT = "the cat sat on the mat.\nthe dog ate the hat!\n" * 40


def char_config(files, **extra):
    return tiny_config(**{"data.source": "files", "data.files": str(files),
                          "data.tokenizer": "char", "data.seq_len": 16,
                          "data.val_fraction": 0.2, "train.steps": 2,
                          "train.checkpoint_every": 0, "train.eval_batches": 1, **extra})


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("char_run")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT)
    work = root / "run"
    loop.train(char_config(corpus), str(work))
    return root, corpus, work


def fresh_copy(char_run, tmp_path):
    """The run and its corpus copied, so a test may change them."""
    root, corpus, work = char_run
    new_corpus = tmp_path / "corpus.txt"
    shutil.copyfile(corpus, new_corpus)
    new_work = tmp_path / "run"
    shutil.copytree(work, new_work)
    cfg = json.loads((new_work / "config.json").read_text())
    cfg["data"]["files"] = str(new_corpus)
    (new_work / "config.json").write_text(json.dumps(cfg))
    return new_corpus, new_work


def test_the_run_saves_its_char_vocabulary(char_run):
    _, _, work = char_run
    record = json.loads((work / wt.FILE).read_text())
    assert record["tokenizer"] == {"kind": "char", "chars": "".join(sorted(set(TEXT)))}
    assert record["specials"] == []  # one document in random windows: no EOD (nanoGPT)
    assert record["identity"]["vocab_size"] == len(set(TEXT))
    tok = wt.load(work)
    assert tok.decode(tok.encode("the hat")) == "the hat"


def test_eval_refuses_a_training_text_with_other_characters(char_run, tmp_path):
    from eval import perplexity
    corpus, work = fresh_copy(char_run, tmp_path)
    # The text replaced by one with a character the run never saw: before, the char
    # vocabulary was rebuilt from it and the loss came out silently wrong.
    corpus.write_text(TEXT + "the zebra\n")
    with pytest.raises(wt.TokenizerMismatch) as e:
        perplexity.run(str(work), progress=False)
    msg = str(e.value)
    assert f"{corpus} line 81 (character 'z')" in msg and str(work / wt.FILE) in msg


def test_a_resume_on_text_with_other_characters_is_refused(char_run, tmp_path):
    root, corpus, work = char_run
    work = shutil.copytree(work, tmp_path / "run")
    # The same command on the same path, whose text now has other characters.
    try:
        corpus.write_text(TEXT.replace("!", "?"))
        with pytest.raises(loop.TrainingError) as e:
            loop.train(char_config(corpus), str(work))
    finally:
        corpus.write_text(TEXT)
    msg = str(e.value)
    assert str(work / wt.FILE) in msg
    assert "'?'" in msg and f"{corpus} line 2" in msg and "lacks 1 of the run's ('!')" in msg
    # nothing was trained or overwritten
    assert json.loads((work / wt.FILE).read_text())["tokenizer"]["chars"].count("!") == 1


@pytest.mark.slow
def test_generation_and_files_need_only_the_workdir(char_run, tmp_path):
    """(Slow: three evaluations compile, about 15 s.)"""
    from eval import generate, perplexity
    corpus, work = fresh_copy(char_run, tmp_path)
    want = perplexity.run(str(work), progress=False)["loss"]
    # Other text made of the run's characters is evaluated with the run's ids.
    corpus.write_text(TEXT[::-1])
    got = perplexity.run(str(work), progress=False)
    assert np.isfinite(got["loss"]) and got["loss"] != want
    held = tmp_path / "held.txt"
    held.write_text(TEXT[:200])
    want = perplexity.run(str(work), files=str(held), progress=False)
    corpus.unlink()  # the training text gone: the saved tokenizer is all they need
    got = perplexity.run(str(work), files=str(held), progress=False)
    assert got["loss"] == want["loss"] and got["tokens"] == want["tokens"]
    out = generate.run(str(work), "the ", 8, temperature=0.0)
    assert len(out["text"]) == 8 and set(out["text"]) <= set(TEXT)
    with pytest.raises(ValueError, match="'Z' is not in the char vocabulary"):
        generate.run(str(work), "Zebra", 4)


def test_files_outside_the_vocabulary_or_not_utf8_are_named_with_their_line(char_run,
                                                                           tmp_path):
    from eval import perplexity
    _, _, work = char_run
    other = tmp_path / "other.txt"
    other.write_text("the cat\nthe mat\nthe Xylophone\n")
    with pytest.raises(wt.TokenizerMismatch, match=rf"{other} line 3 \(character 'X'\) "
                                                   r"is not in this run's vocabulary"):
        perplexity.run(str(work), files=str(other), progress=False)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat\nthe \xff mat\n")
    with pytest.raises(sources.TextDecodeError, match=rf"{bad} line 2 \(byte 12\)"):
        perplexity.run(str(work), files=str(bad), progress=False)


def test_eval_cli_error_is_one_line(char_run, tmp_path):
    _, work = fresh_copy(char_run, tmp_path)
    other = tmp_path / "other.txt"
    other.write_text("Q\n")
    r = run_cli([sys.executable, "-m", "eval.perplexity", f"--workdir={work}",
                 f"--files={other}"])
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and f"{other} line 1 (character 'Q')" in lines[-1]
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ saved tokenizers
def test_saved_tokenizers_round_trip_without_their_sources(tmp_path):
    spm_dir = tmp_path / "spm"
    text = ["the quick brown fox jumps over the lazy dog " * 3 + str(i) for i in range(200)]
    cases = {
        "byte": toks.WithSpecials(toks.ByteTokenizer(), ["<|eod|>"]),
        "char": toks.CharTokenizer.from_text("abc xyz"),
        "integer": toks.IntegerTokenizer(64),
        "sentencepiece": toks.SentencePieceTokenizer.train(text, spm_dir, 294),
    }
    for name, tok in cases.items():
        work = tmp_path / name
        wt.save(work, tok)
        want = wt.identity(tok)
        sample = "3 17 5" if name == "integer" else "abc xyz"
        ids = tok.encode(sample)
        if name == "sentencepiece":
            shutil.rmtree(spm_dir)  # the workdir holds its own copy
        back = wt.load(work)
        assert wt.identity(back) == want
        assert back.encode(sample) == ids
    assert (tmp_path / "sentencepiece" / wt.SENTENCEPIECE_FILE).exists()


def test_a_changed_model_file_or_a_damaged_record_is_named(tmp_path):
    wt.save(tmp_path, toks.CharTokenizer.from_text("abc"))
    record = json.loads((tmp_path / wt.FILE).read_text())
    record["tokenizer"]["chars"] = "abd"
    (tmp_path / wt.FILE).write_text(json.dumps(record))
    with pytest.raises(wt.TokenizerMismatch, match="does not match the identity"):
        wt.load(tmp_path)
    (tmp_path / wt.FILE).write_text("{not json")
    with pytest.raises(wt.TokenizerMismatch, match=f"{tmp_path / wt.FILE} is damaged"):
        wt.load(tmp_path)


def test_integer_prompts_are_explained():
    with pytest.raises(ValueError, match=r"integer ids in \[0, 64\).*'3 17 5'"):
        toks.IntegerTokenizer(64).encode("ROMEO:")


# ------------------------------------------------------------------------ decoding
def test_invalid_utf8_is_named_by_file_and_line_in_every_reader(tmp_path):
    good = tmp_path / "a.txt"
    good.write_text("fine\n" * 3)
    bad = tmp_path / "b.txt"
    bad.write_bytes("ok é\nsecond\n".encode() + b"third \xc3\x28 bad\n" + b"more\n")
    where = rf"{bad} line 3 \(byte 19\) is not valid UTF-8 \(bytes c3\)"
    for sample_by in ("document", "paragraph", "line"):
        with pytest.raises(sources.TextDecodeError, match=where):
            sources.load_files(str(tmp_path / "*.txt"), sample_by)
    with pytest.raises(sources.TextDecodeError, match=where):
        prep.prepare(str(tmp_path / "*.txt"), tmp_path / "store", progress=False)
    # Small chunks: the offset is right across chunk edges and a split 2-byte character.
    for chunk in (1, 2, 3, 5, 7):
        assert sources.find_decode_error(str(bad), chunk=chunk) == \
            sources.find_decode_error(str(bad))
    assert sources.find_decode_error(str(good)) is None


def test_encoding_errors_replace_reads_bad_bytes_as_the_replacement_character(tmp_path):
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"one\n\ntwo \xff three\n")
    docs = sources.load_files(str(bad), "paragraph", encoding_errors="replace")
    assert docs == ["one", "two \ufffd three\n"]
    m = prep.prepare(str(bad), tmp_path / "store", sample_by="paragraph",
                     encoding_errors="replace", progress=False)
    assert m["documents"] == 2 and m["settings"]["encoding_errors"] == "replace"
    # the store's ids are those of the replaced text
    tokens = np.load(tmp_path / "store" / m["shards"][0]["tokens_file"])
    assert bytes(tokens[4:-1].astype(np.uint8)) == "two \ufffd three\n".encode()
    with pytest.raises(ValueError, match="data.encoding_errors='ignore'"):
        sources.load_files(str(bad), encoding_errors="ignore")


def test_train_cli_names_the_bad_file_in_one_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"x" * 100 + b"\n\xfe\n")
    args = [sys.executable, str(ROOT / "train.py"), f"--config={ROOT / 'configs/lm_files.py'}",
            f"--workdir={tmp_path / 'run'}", f"--config.data.files={bad}",
            "--config.logging.wandb=disabled"]
    r = run_cli(args)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"error: data: text file {bad} line 2 (byte 101) is not valid UTF-8")
    r = run_cli(args + ["--config.data.encoding_errors=wrong"])
    assert r.returncode == 1
    assert "data.encoding_errors='wrong': use strict" in r.stderr.strip().splitlines()[-1]
