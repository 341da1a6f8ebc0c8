"""eval.recall's NIAH grid on RULER's harder needles (data/niah.py): settings passed from
the run's dataset per mixture component, exact / per-digit / per-value scoring of long
answers, configs/compare_niah.py's :ruler variant, and one tiny trained run end to end."""
import json
import math

import numpy as np
import pytest

import data
from eval import recall
from tests.eval.conftest import load_compare_config

SEQ = 96


def ruler_dataset(seq_len=SEQ):
    """The :ruler training mixture without text (its NIAH components), untrained."""
    cfg = load_compare_config("compare_niah", "train_ruler_synthetic")["data"]
    cfg["seq_len"] = seq_len
    return data.build(cfg, seed=0)


def full(ex, i):
    return np.append(ex["inputs"][i], ex["targets"][i][-1])


def test_each_component_is_drawn_with_its_own_settings():
    """kind=<component> draws that component's needles: haystack, keys, digits, values;
    a kind name keeps today's meaning (the first NIAH task's settings, that kind)."""
    ds = ruler_dataset()
    comps = recall.niah_components(ds)
    assert list(comps) == ["mk2", "mk3", "multikey", "mv", "passkey", "passkey7"]
    needle = comps["mk2"].base_vocab
    q_id, key0 = needle + 1, needle + 12
    want = {  # key ids per needle, answer digits, needles, haystack made of needles
        "passkey": (0, 5, 1, False), "passkey7": (0, 7, 1, False),
        "multikey": (1, 5, 4, False), "mv": (1, 28, 4, False),
        "mk2": (2, 7, (SEQ + 1 - 10) // 10, True),
        "mk3": (4, 16, (SEQ + 1 - 21) // 21, True)}
    for name, (key_len, answer, n_needles, all_needles) in want.items():
        spec = recall.niah_spec(ds, name)
        assert spec["key_len"] == (key_len or 1)
        assert spec["num_digits"] * spec["num_values"] == answer
        ex = recall.niah_generate(ds, SEQ, 0.5, 6, seed=1, kind=name)
        assert ex["inputs"].shape == (6, SEQ)
        assert (ex["mask"].sum(1) == answer).all(), name
        for i in range(6):
            seq = full(ex, i)
            q = int(np.nonzero(seq == q_id)[0][-1])
            assert len(seq) - q == 1 + key_len + answer, name
            starts = np.nonzero(seq[:q] == needle)[0]
            assert len(starts) == n_needles, name
            keys = seq[q + 1:q + 1 + key_len]
            assert ((keys >= key0) & (keys < key0 + 64)).all()
            if all_needles:
                L = 1 + key_len + answer
                lead = q % L
                np.testing.assert_array_equal(starts, lead + L * np.arange(n_needles))
    # a kind, not a component, as before: the first component's settings with that kind
    spec = recall.niah_spec(ds, "passkey")  # a component of that name wins
    assert spec["num_digits"] == 5 and spec["haystack"] == "filler"
    with pytest.raises(ValueError, match="mk2, mk3, multikey, mv, passkey, passkey7"):
        recall.niah_spec(ds, "mk4")


def oracle(wrong):
    """A stats_fn that gets every masked target right except those wrong(batch) marks."""
    def stats(batch):
        hit = np.asarray(batch["mask"]) > 0
        return None, hit & ~wrong(batch)
    return stats


def test_scoring_seven_digit_and_multi_value_answers():
    """per_digit, exact and per_value from hits at the answer digits, against counts
    worked out by hand from the layout (4 values x 7 digits for mv)."""
    ds = ruler_dataset()

    def last_digit_of_value(v, rows):
        def wrong(batch):
            w = np.zeros_like(batch["mask"], bool)
            T = w.shape[1]
            # answer digit j of value v is the target at T - 28 + 7 v + j
            w[rows(len(w)), T - 28 + 7 * v + 6] = True
            return w
        return wrong

    def first(n):
        return slice(0, n // 2)

    config = {"data": {"seq_len": SEQ}}
    got = recall.niah_grid(oracle(last_digit_of_value(1, first)), config, ds,
                           length_multiples=(1,), num_depths=2, num_examples=8,
                           batch_size=8, kind="mv")
    assert got["needles"]["num_values"] == 4 and got["needles"]["num_digits"] == 7
    for c in got["cells"]:
        # half the examples miss one digit of their second value
        assert c["exact"] == 0.5
        assert c["per_digit"] == pytest.approx(1 - 0.5 / 28)
        assert c["per_value"] == pytest.approx(1 - 0.5 / 4)
    assert got["per_value"] == pytest.approx(1 - 0.5 / 4)
    # passkey7: every example right but for its 7th digit in the first two of 8 examples
    def seventh(batch):
        w = np.zeros_like(batch["mask"], bool)
        w[:2, -1] = True
        return w
    got = recall.niah_grid(oracle(seventh), config, ds, length_multiples=(1, 2),
                           num_depths=3, num_examples=8, batch_size=8, kind="passkey7")
    assert len(got["cells"]) == 6 and "per_value" not in got
    for c in got["cells"]:
        assert c["exact"] == 0.75 and c["per_digit"] == pytest.approx(1 - 2 / 56)
        assert c["examples"] == 8


def test_ruler_variant_intervals_and_mixture():
    """:ruler: the examples of a cell, one task at one length over its depths (issue 18's
    cell: the 6 x 32 = 192 examples it found too few), keep the 95% Wilson interval within
    +-2 points at any accuracy (and the Wald one); every eval kind is a training
    component, each generates at the longest test length, and each needle row's answer
    weighs as much as the others."""
    cfg = load_compare_config("compare_niah", "ruler")
    n = cfg["eval"]["niah"]["num_examples"] * cfg["eval"]["niah"]["num_depths"]
    z = 1.959963984540054

    def wilson_half(p, n):
        return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert max(wilson_half(p, n) for p in np.linspace(0, 1, 1001)) <= 0.02
    assert z * math.sqrt(0.25 / n) <= 0.02
    assert wilson_half(0.5, 2300) > 0.02  # the bound bites: fewer would not do
    assert len(cfg["seeds"]) >= 3
    train = load_compare_config("compare_niah", "train_ruler")["data"]
    comps = train["components"]
    assert list(cfg["eval"]["kinds"]) == ["passkey", "multikey", "passkey7", "mk2", "mk3",
                                          "mv"]
    assert set(cfg["eval"]["kinds"]) <= set(comps)
    needles = [c for k, c in comps.items() if k != "text"]
    assert comps["text"]["weight"] == sum(c["weight"] for c in needles)
    for k in cfg["eval"]["kinds"]:
        c = comps[k]
        answer = c.get("num_digits", 5) * c.get("num_values", 1)
        assert c["loss_weight"] * answer == pytest.approx(250.0)
    ds = ruler_dataset(seq_len=cfg["overrides"]["data"]["seq_len"])
    longest = 512 * max(cfg["eval"]["niah"]["length_multiples"])
    for k in cfg["eval"]["kinds"]:
        ex = recall.niah_generate(ds, longest, 0.3, 1, seed=0, kind=k)
        assert ex["inputs"].shape == (1, longest)
    tiny = load_compare_config("compare_niah", "ruler_tiny")
    assert tiny["eval"]["niah"]["num_examples"] <= 8
    assert tiny["overrides"]["train"]["steps"] <= 5
    assert tuple(tiny["eval"]["kinds"]) == tuple(cfg["eval"]["kinds"])


@pytest.fixture(scope="module")
def ruler_run(tmp_path_factory):
    """compare_niah:ruler_tiny's softmax run, trained one step in this process."""
    from sweeps import grid, runner

    cfg = load_compare_config("compare_niah", "ruler_tiny")
    (run,) = [r for r in grid.expand_grid(cfg) if r["mixer"] == "softmax"]
    run = dict(run, overrides={**run["overrides"], "train.steps": 1,
                               "train.eval_every": 0, "train.checkpoint_every": 0})
    workdir = tmp_path_factory.mktemp("niah_ruler") / run["name"]
    runner.train_inprocess(cfg, run, str(workdir))
    return cfg, workdir


def test_recall_cli_grids_every_task_of_a_trained_run(ruler_run):
    """eval.recall on a 1-step model: a grid per NIAH component (the new ones with their
    settings), recall_niah.json and a heatmap each; the numbers are the model's own
    argmax hits on the same examples, recomputed here."""
    from eval import common

    cfg, workdir = ruler_run
    res = recall.run(str(workdir), "niah", num_examples=4, batch_size=4,
                     length_multiples=(1, 2), num_depths=2)
    kinds = res["kinds"]
    assert list(kinds) == ["mk2", "mk3", "multikey", "mv", "passkey", "passkey7"]
    assert res["cells"] == kinds["mk2"]["cells"]  # the first task is the top level
    saved = json.loads((workdir / "recall_niah.json").read_text())
    assert set(saved["kinds"]) == set(kinds)
    assert kinds["mk3"]["needles"]["haystack"] == "needles"
    assert kinds["mk3"]["needles"]["key_len"] == 4
    assert kinds["mv"]["needles"]["num_values"] == 4
    assert "per_value" in kinds["mv"] and "per_value" not in kinds["mk2"]
    for name, g in kinds.items():
        assert [(c["length"], c["depth"]) for c in g["cells"]] == \
            [(n, d) for n in (SEQ, 2 * SEQ) for d in (0.0, 1.0)]
        assert all(c["examples"] == 4 for c in g["cells"])
        png = "niah_heatmap.png" if name == "mk2" else f"niah_heatmap_{name}.png"
        assert (workdir / png).is_file()
    # independent recount for mv: argmax of the logits at the answer digits
    model, config, dataset, _ = common.load_run(str(workdir))
    logits_fn = common.make_logits_fn(model)
    for i, c in enumerate(kinds["mv"]["cells"]):
        if c["length"] != SEQ:
            continue  # one more compile each; the training length shows the count
        ex = recall.niah_generate(dataset, c["length"], c["depth"], 4, 4321 + i, "mv")
        logits = np.asarray(logits_fn(ex["inputs"], np.ones_like(ex["inputs"])))
        hit = (logits.argmax(-1) == ex["targets"])[:, -28:]
        assert c["per_digit"] == pytest.approx(hit.mean())
        assert c["exact"] == pytest.approx(hit.all(1).mean())
        assert c["per_value"] == pytest.approx(hit.reshape(4, 4, 7).all(2).mean())


def test_sweep_measurement_records_every_task(ruler_run):
    """sweeps.tasks with :ruler_tiny's eval section: passkey is the headline, each other
    task its exact_/per_digit_/grid_ entry; the report's per-task table shows them."""
    from eval import report
    from sweeps import tasks

    cfg, workdir = ruler_run
    rec = tasks.evaluate_run("niah", str(workdir), cfg["eval"])
    m = rec["metrics"]
    assert m["grid"]["kind"] == "passkey" and m["grid"]["needles"]["num_digits"] == 5
    for k in ("multikey", "passkey7", "mk2", "mk3", "mv"):
        assert m[f"grid_{k}"]["kind"] == k and f"exact_{k}" in m
    assert m["grid_passkey7"]["needles"]["num_digits"] == 7
    recs = [{"task": "niah", "setting": "L96", "mixer": "softmax", "size": "d32",
             "lr": 1e-3, "seed": s, **rec} for s in (0, 1)]
    table = report.niah_tasks_table(report.best_lr(recs))
    header = table.splitlines()[0]
    for k in cfg["eval"]["kinds"]:
        assert f"{k} @train" in header
    assert "mv per value @train" in header
    row = table.splitlines()[2].split(" | ")
    # two equal seeds: the interval has zero width; mk2's exact at the training length
    col = header.split(" | ").index("mk2 @train")
    want = np.mean([c["exact"] for c in m["grid_mk2"]["cells"] if c["length"] == SEQ])
    assert row[col].startswith(f"{want:.3f} ± 0.000 (n 2)")
