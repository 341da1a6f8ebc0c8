"""The sweep report's points: the best lr by mean, its 95% t-interval over seeds, ties
marked where intervals overlap, the seven-setting column, and the scatter's two axes."""
import math

import pytest

from eval import report


def _rec(mixer, size, lr, seed, acc, setting="T256_kv16", settings=None, state=1000):
    m = {"accuracy": acc}
    if settings is not None:
        m["settings"] = settings
        m["settings_mean"] = sum(settings.values()) / len(settings)
    return {"task": "mqar", "setting": setting, "mixer": mixer, "size": size, "lr": lr,
            "seed": seed, "metrics": m, "state_size": state}


def _records():
    recs = []
    # a, d64: lr 1e-3 seeds 0.8, 0.9, 1.0 (mean 0.9, half 0.248414); lr 1e-2 mean 0.5
    for seed, acc in enumerate((0.8, 0.9, 1.0)):
        recs.append(_rec("a", "d64", 1e-3, seed, acc))
    for seed, acc in enumerate((0.4, 0.5, 0.6)):
        recs.append(_rec("a", "d64", 1e-2, seed, acc))
    # b, d64: mean 0.7, s 0.01, half 4.302653 * 0.01 / sqrt(3) = 0.0248414:
    # [0.675, 0.725] overlaps a's [0.652, 1.148]: a tie
    for seed, acc in enumerate((0.69, 0.70, 0.71)):
        recs.append(_rec("b", "d64", 1e-3, seed, acc))
    # c, d64: mean 0.3 +- 0.0248: below a's interval, unmarked
    for seed, acc in enumerate((0.29, 0.30, 0.31)):
        recs.append(_rec("c", "d64", 1e-3, seed, acc))
    # a, d128 alone at its width: best; b, d128 one seed: undecided
    for seed, acc in enumerate((0.95, 0.96, 0.97)):
        recs.append(_rec("a", "d128", 1e-3, seed, acc))
    recs.append(_rec("b", "d128", 1e-3, 0, 0.99))
    return recs


def test_cells_carry_the_best_lr_mean_and_its_t_interval():
    best = report.best_lr(_records())
    a = best[("mqar", "T256_kv16", "a", "d64")]
    assert a["lr"] == 1e-3 and a["value"] == pytest.approx(0.9)
    assert a["interval"].n == 3 and a["interval"].half == pytest.approx(0.2484138, abs=1e-7)
    assert a["by_lr"][1e-2].mean == pytest.approx(0.5)
    md = report.markdown(_records(), title="t")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
            for line in md.splitlines() if line.startswith("| ")}
    assert "0.900 (lr 0.001) ± 0.248 (n 3) [best]" in rows[("a", "d64")]
    assert "0.700 (lr 0.001) ± 0.025 (n 3) [tie]" in rows[("b", "d64")]
    assert rows[("c", "d64")].rstrip(" |").endswith("0.300 (lr 0.001) ± 0.025 (n 3)")
    # at d128 the one-seed b has the higher mean: nothing is decided against it
    assert "0.990 (lr 0.001) (n 1, no interval) [best]" in rows[("b", "d128")]
    assert "0.960 (lr 0.001) ± 0.025 (n 3) [?]" in rows[("a", "d128")]
    # state in numbers and in Zoology's bytes (x 4)
    assert "| 1,000 | 4,000 |" in rows[("a", "d64")]
    assert report.LEGEND in md


def test_the_sweeps_metric_picks_the_lr_and_fills_the_seven_setting_column():
    """Judged by settings_mean (the Based-era recipe): lr 1e-2 wins on it although its
    validation accuracy is lower; the per-setting table shows each test setting's mean
    and the seven-setting mean with its interval."""
    names = [f"T{t}_kv{k}" for t, k in [(64, 4), (64, 8), (64, 16), (128, 32), (256, 64),
                                        (512, 128), (1024, 256)]]
    recs = []
    for seed in range(3):
        low = {n: 0.5 + 0.01 * seed for n in names}           # mean 0.51 +- ...
        high = {n: 0.8 + 0.02 * seed for n in names}          # mean 0.82
        recs.append(_rec("a", "d64", 1e-3, seed, 0.99, "mixture", low))
        recs.append(_rec("a", "d64", 1e-2, seed, 0.90, "mixture", high))
    assert report.best_lr(recs)[("mqar", "mixture", "a", "d64")]["lr"] == 1e-3
    best = report.best_lr(recs, "settings_mean")[("mqar", "mixture", "a", "d64")]
    assert best["lr"] == 1e-2 and best["value"] == pytest.approx(0.82)
    # 0.80, 0.82, 0.84: s = 0.02, half = 4.302653 * 0.02 / sqrt(3) = 0.0496828
    assert best["interval"].half == pytest.approx(0.0496828, abs=1e-7)
    md = report.markdown(recs, title="t", metric="settings_mean")
    assert "## MQAR accuracy (settings_mean)" in md
    assert "0.820 (lr 0.01) ± 0.050 (n 3) [best]" in md
    table = report.settings_table(report.best_lr(recs, "settings_mean"))
    header, _, row = table.splitlines()
    assert header.split("|")[5:-2] == [f" {n} " for n in names]
    assert "mean of 7 ± 95% (n seeds)" in header
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["a", "d64", "mixture", "0.010"]
    assert cells[4:11] == ["0.820"] * 7 and cells[11] == "0.820 ± 0.050 (n 3)"


def test_scatter_has_numbers_and_bytes_axes_error_bars_and_panel_references(
        monkeypatch, tmp_path):
    import matplotlib

    from eval import plots
    figs = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save",
                        lambda fig, path: figs.append(fig) or real_save(fig, path))
    pts = [{"setting": "mixture", "mixer": "a", "state_size": 1e3, "value": 0.5,
            "half": 0.1},
           {"setting": "mixture", "mixer": "a", "state_size": 4e3, "value": 0.9,
            "half": math.nan},
           {"setting": "T256_kv16", "mixer": "a", "state_size": 1e3, "value": 0.7}]
    refs = [{"mixer": "gated_deltanet", "state_size": 4.3e3, "value": 0.89,
             "setting": "mixture", "source": "Zoology"},
            {"mixer": "taylor", "label": "Based", "state_size": 2.4e3, "value": 0.67}]
    path = plots.recall_vs_state(pts, str(tmp_path / "s.png"), references=refs)
    assert (tmp_path / "s.png").stat().st_size > 1000 and path == str(tmp_path / "s.png")
    (fig,) = figs
    main = [ax for ax in fig.axes if ax.get_xlabel().startswith("decode state size")]
    assert [ax.get_title() for ax in main] == ["mixture", "T256_kv16"]
    for ax in main:
        assert ax.get_xlabel() == "decode state size (numbers per sequence)"
        (top,) = [c for c in ax.child_axes
                  if c.get_xlabel().startswith("state size (bytes")]
        # the top axis is the bottom one x 4
        assert top.get_xlim() == pytest.approx(tuple(4 * x for x in ax.get_xlim()))
        stars = {(line.get_xdata()[0], line.get_ydata()[0]): line.get_label()
                 for line in ax.get_lines() if line.get_marker() == "*"}
        want = {(2.4e3, 0.67): "Based (reference)"}
        if ax.get_title() == "mixture":
            want[(4.3e3, 0.89)] = "gated_deltanet (Zoology)"
        assert stars == want
    bars = [c for c in main[0].containers
            if isinstance(c, matplotlib.container.ErrorbarContainer)]
    (bar,) = bars
    segs = bar.lines[2][0].get_segments()  # the vertical bars: +-0.1 at x=1e3, 0 at 4e3
    assert [tuple(map(tuple, s)) for s in segs] == [((1e3, 0.4), (1e3, 0.6)),
                                                    ((4e3, 0.9), (4e3, 0.9))]
    assert not main[1].containers  # no interval on that panel: a plain line


def test_niah_grid_table_is_the_mean_over_seeds():
    """One failed seed among three shows in the depth x length table as a third of the
    cell, not as whichever seed happened to be listed first."""
    def rec(seed, exact):
        cells = [{"length": n, "depth": d, "exact": exact} for n in (512, 1024)
                 for d in (0.0, 0.5)]
        cells[0] = {**cells[0], "exact": exact / 2}
        return {"task": "niah", "setting": "L512", "mixer": "m", "size": "d8", "lr": 1e-3,
                "seed": seed, "metrics": {"exact": exact, "grid": {"cells": cells}}}

    recs = [rec(0, 0.0), rec(1, 1.0), rec(2, 1.0)]
    lines = report.niah_grid_table(recs).splitlines()
    assert lines[0].split(" | ")[1:] == ["512", "1024 |"]
    assert lines[2].startswith("| 0.00 | 0.333 | 0.667 |")
    assert lines[3].startswith("| 0.50 | 0.667 | 0.667 |")
    assert "mean over 3 runs" in report.markdown(recs, title="t")


def test_niah_seeds_table_lists_each_seed_at_the_training_length():
    """Each seed of the best lr in its own row, in seed order: every task's exact match
    averaged over the depths at the training length only (not the longer lengths), the
    headline per-digit and the best validation loss; the other lr's runs are left out."""
    def grid(kind, at_train, beyond):
        cells = [{"length": 512, "depth": 0.0, "exact": at_train[0]},
                 {"length": 512, "depth": 0.5, "exact": at_train[1]},
                 {"length": 1024, "depth": 0.0, "exact": beyond}]
        return {"kind": kind, "train_length": 512, "cells": cells}

    def rec(seed, lr, passkey, mk2, per_digit, loss):
        return {"task": "niah", "setting": "L512", "mixer": "m", "size": "d8", "lr": lr,
                "seed": seed, "metrics": {
                    "exact": sum(passkey) / 2, "per_digit": per_digit,
                    "best_val_loss": loss, "grid": grid("passkey", passkey, 0.5),
                    "grid_mk2": grid("mk2", mk2, 0.25)}}

    recs = [rec(1, 1e-3, (0.0, 0.2), (0.0, 0.0), 0.125, 1.75),
            rec(0, 1e-3, (1.0, 0.9), (0.8, 0.6), 0.875, 1.5),
            rec(0, 1e-2, (0.0, 0.0), (0.0, 0.0), 0.1, 3.0)]
    lines = report.niah_seeds_table(report.best_lr(recs)).splitlines()
    assert lines[0].split(" | ")[4:] == ["seed", "passkey @train", "mk2 @train",
                                         "per-digit (grid)", "best val loss |"]
    assert len(lines) == 4  # header, rule, the best lr's two seeds
    assert lines[2].split(" | ")[4:] == ["0", "0.950", "0.700", "0.875", "1.500 |"]
    assert lines[3].split(" | ")[4:] == ["1", "0.100", "0.000", "0.125", "1.750 |"]
    assert "### Each seed at the training length" in report.markdown(recs, title="t")


def test_by_seed_table_shows_a_failed_seed_beside_the_others():
    """The best lr's seeds in seed order with their own accuracies (the 0.064-or-0.996
    MQAR run of issue 18), one row per cell; the worse lr's seeds are not listed. Each
    cell counts its seeds at accuracy >= 0.5 and sets the count against the most
    reliable mixer of its setting and width (more seeds among equal fractions), and gives
    where one more seed should land (the 95% prediction interval)."""
    recs = [_rec("a", "d64", 1e-3, 2, 0.995), _rec("a", "d64", 1e-3, 0, 0.996),
            _rec("a", "d64", 1e-3, 1, 0.064), _rec("a", "d64", 1e-2, 0, 0.05),
            _rec("a", "d64", 1e-2, 1, 0.06), _rec("b", "d128", 1e-3, 0, 0.5),
            _rec("c", "d64", 1e-3, 0, 0.99), _rec("c", "d64", 1e-3, 1, 0.98),
            _rec("d", "d64", 1e-3, 0, 0.97)]
    lines = report.by_seed_table(report.best_lr(recs), "mqar").splitlines()
    assert lines[0] == ("| setting | mixer | size | lr | accuracy by seed | seeds >= 0.5 | "
                        "against the most reliable (Fisher's exact) | a new seed, 95% |")
    # 2 of 3 against c's 2 of 2: C(4, k) C(1, 3 - k) / 10 is 0.6 at the observed k = 2
    # and 0.4 at k = 3 (the only counts the margins allow): p 1.
    # A new seed of a: mean 0.685, s = sqrt((0.311^2 + 0.621^2 + 0.310^2) / 2) = 0.537802,
    # 0.685 +- 4.302653 x 0.537802 x sqrt(1 + 1/3) = 0.685 +- 2.671949
    assert lines[2] == ("| T256_kv16 | a | d64 | 0.001 | 0: 0.996, 1: 0.064, 2: 0.995 | "
                        "2 of 3 | c (2 of 2): p 1 | [-1.987, 3.357] (n 3) |")
    assert lines[3] == "| T256_kv16 | b | d128 | 0.001 | 0: 0.500 | 1 of 1 | - | - |"
    # c: 0.985 +- 12.706205 x 0.007071 x sqrt(1 + 1/2) = 0.985 +- 0.110039
    assert lines[4] == ("| T256_kv16 | c | d64 | 0.001 | 0: 0.990, 1: 0.980 | 2 of 2 | - | "
                        "[0.875, 1.095] (n 2) |")
    assert lines[5] == ("| T256_kv16 | d | d64 | 0.001 | 0: 0.970 | 1 of 1 | "
                        "c (2 of 2): p 1 | - |")
    assert len(lines) == 6
    assert "### Each seed at the best lr" in report.markdown(recs, title="t")


def test_niah_retrieval_table_counts_seeds_and_tests_them_against_the_most_reliable():
    """A seed retrieves at a headline exact match >= 0.5 at the training length (the
    longer lengths do not count); each mixer's count is set against the mixer whose
    seeds retrieve most often (among equal fractions, the one with more seeds)."""
    def rec(mixer, seed, at_train, lr=1e-3):
        cells = [{"length": 512, "depth": 0.0, "exact": at_train},
                 {"length": 1024, "depth": 0.0, "exact": 1.0}]
        return {"task": "niah", "setting": "L512", "mixer": mixer, "size": "d8", "lr": lr,
                "seed": seed, "metrics": {"exact": at_train, "grid": {
                    "kind": "passkey", "train_length": 512, "cells": cells}}}

    recs = ([rec("a", s, 1.0) for s in range(3)]           # 3 of 3
            + [rec("b", s, 0.9) for s in range(6)]         # 6 of 6: the reference
            + [rec("c", 0, 0.5)] + [rec("c", s, 0.49) for s in range(1, 6)]  # 1 of 6
            + [rec("c", s, 0.0, lr=1e-2) for s in range(6)])  # another lr: not counted
    lines = report.niah_retrieval_table(report.best_lr(recs)).splitlines()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[4:] for line in lines[2:]}
    assert rows["a"] == ["3 of 3", "b (6 of 6): p 1 |"]
    assert rows["b"] == ["6 of 6", "- |"]
    # 1 of 6 against 6 of 6: 14 / 924 = 0.01515 (tests/eval/test_intervals.py)
    assert rows["c"] == ["1 of 6", "b (6 of 6): p 0.0152 |"]
    assert "### Seeds that retrieve" in report.markdown(recs, title="t")


def test_every_lr_table_lists_each_lr_with_its_interval_and_learned_seeds():
    """Every lr a cell ran, not only the best: the mean with its 95% t-interval (a, d64 at
    1e-2: 0.4, 0.5, 0.6 -> 0.5 ± 4.302653 x 0.1 / sqrt(3) = 0.248), the seeds at >= 0.5
    (0.5 counts), the best lr marked, and each point marked against the other mixers of
    its width at the same lr (d64 at 1e-3: a [0.652, 1.148] best, b [0.675, 0.725] a tie,
    c [0.275, 0.325] apart; d128: b's one seed leaves a undecided; a's 1e-2 alone: no
    mark); empty when every cell ran one lr."""
    recs = _records()
    lines = report.every_lr_table(report.best_lr(recs), "mqar").splitlines()
    assert lines[0] == ("| setting | mixer | size | lr | accuracy ± 95% (n seeds) | "
                        "seeds >= 0.5 | best lr | against the mixers at this lr |")
    rows = [line.split(" | ") for line in lines[2:]]
    assert [r[1:4] for r in rows] == [["a", "d128", "0.001"], ["a", "d64", "0.001"],
                                      ["a", "d64", "0.010"], ["b", "d128", "0.001"],
                                      ["b", "d64", "0.001"], ["c", "d64", "0.001"]]
    assert rows[0][4:] == ["0.960 ± 0.025 (n 3)", "3 of 3", "best", "? |"]
    assert rows[1][4:] == ["0.900 ± 0.248 (n 3)", "3 of 3", "best", "best |"]
    assert rows[2][4:] == ["0.500 ± 0.248 (n 3)", "2 of 3", "", " |"]
    assert rows[3][4:] == ["0.990 (n 1, no interval)", "1 of 1", "best", "best |"]
    assert rows[4][4:] == ["0.700 ± 0.025 (n 3)", "3 of 3", "best", "tie |"]
    assert rows[5][4:] == ["0.300 ± 0.025 (n 3)", "0 of 3", "best", " |"]
    assert "### Every lr" in report.markdown(recs, title="t")
    one_lr = [r for r in recs if r["lr"] == 1e-3]
    assert report.every_lr_table(report.best_lr(one_lr), "mqar") == ""
    assert "### Every lr" not in report.markdown(one_lr, title="t")


def test_every_lr_table_counts_niah_seeds_at_the_training_length():
    """NIAH's learned seeds by the headline exact match at the training length (0.9 at
    512 learns even where the grid mean, which the interval shows, is under 0.5)."""
    def rec(seed, lr, at_train, beyond):
        cells = [{"length": 512, "depth": 0.0, "exact": at_train},
                 {"length": 4096, "depth": 0.0, "exact": beyond}]
        return {"task": "niah", "setting": "L512", "mixer": "m", "size": "d8", "lr": lr,
                "seed": seed, "metrics": {"exact": (at_train + beyond) / 2, "grid": {
                    "kind": "passkey", "train_length": 512, "cells": cells}}}

    recs = [rec(0, 1e-3, 0.9, 0.0), rec(1, 1e-3, 0.1, 0.0),
            rec(0, 3e-4, 1.0, 0.2), rec(1, 3e-4, 1.0, 0.4)]
    lines = report.every_lr_table(report.best_lr(recs), "niah").splitlines()
    assert lines[0].split(" | ")[4:6] == ["exact over the grid ± 95% (n seeds)",
                                          "seeds >= 0.5 at the training length"]
    rows = {line.split(" | ")[3]: line.split(" | ")[4:] for line in lines[2:]}
    # 3e-4: grid means 0.6, 0.7 -> 0.65 ± 12.706205 x 0.0707107 / sqrt(2) = 0.635
    assert rows["3.00e-04"] == ["0.650 ± 0.635 (n 2)", "2 of 2", "best", " |"]
    # 1e-3: 0.45, 0.05 -> 0.25 ± 12.706205 x 0.2828427 / sqrt(2) = 2.541
    assert rows["0.001"] == ["0.250 ± 2.541 (n 2)", "1 of 2", "", " |"]


def test_niah_same_lr_table_compares_mixers_at_each_shared_lr():
    """Mixers side by side at each lr two of them ran, not each at its own best lr: b's
    best lr (1e-3, by the grid's headline exact match) is its worse one on multi-value,
    which only the same-lr rows show. Cells: the mean at the training length over seeds
    with its 95% t-interval, marked within (setting, size, lr); an lr one mixer ran alone
    (b's 1e-3, a's 1e-2) has no rows, and the section is absent when no lr is shared."""
    def grid(kind, at_train, beyond=0.0):
        return {"kind": kind, "train_length": 512,
                "cells": [{"length": 512, "depth": 0.0, "exact": at_train},
                          {"length": 1024, "depth": 0.0, "exact": beyond}]}

    def rec(mixer, lr, seed, exact, passkey, mv):
        return {"task": "niah", "setting": "L512", "mixer": mixer, "size": "d8", "lr": lr,
                "seed": seed, "metrics": {"exact": exact, "grid": grid("passkey", passkey),
                                          "grid_mv": grid("mv", mv)}}

    recs = []
    for seed, mv in enumerate((0.7, 0.8, 0.9)):      # b at 3e-4: mv 0.8 ± 0.248
        recs.append(rec("b", 3e-4, seed, 0.5, 1.0, mv))
    for seed, mv in enumerate((0.1, 0.1, 0.1)):      # b at 1e-3: its best lr (0.6 > 0.5)
        recs.append(rec("b", 1e-3, seed, 0.6, 1.0, mv))
    for seed, mv in enumerate((0.0, 0.02, 0.04)):    # a at 3e-4: mv 0.02 ± 0.050
        recs.append(rec("a", 3e-4, seed, 0.5, 1.0, mv))
    for seed in range(2):
        recs.append(rec("a", 1e-2, seed, 0.0, 0.0, 0.0))
    best = report.best_lr(recs)
    assert best["niah", "L512", "b", "d8"]["lr"] == 1e-3
    lines = report.niah_same_lr_table(best).splitlines()
    assert lines[0] == "| mixer | size | setting | lr | passkey @train | mv @train |"
    rows = [line.split(" | ") for line in lines[2:]]
    assert [r[:4] for r in rows] == [["| a", "d8", "L512", "3.00e-04"],
                                     ["| b", "d8", "L512", "3.00e-04"]]
    # passkey 1.000 ± 0.000 in both: a tie (the first of equal means is "best")
    assert rows[0][4] == "1.000 ± 0.000 (n 3) [best]"
    assert rows[1][4] == "1.000 ± 0.000 (n 3) [tie]"
    # mv: b 0.8 ± 4.302653 x 0.1 / sqrt(3) = 0.248 [best]; a 0.02 ± 4.302653 x 0.02 /
    # sqrt(3) = 0.050: [-0.03, 0.07] lies apart from b's [0.55, 1.05], so a is unmarked
    assert rows[1][5] == "0.800 ± 0.248 (n 3) [best] |"
    assert rows[0][5] == "0.020 ± 0.050 (n 3) |"
    # at each one's best lr (the per-task table) b's multi-value is its 1e-3's 0.100
    best_rows = [line.split(" | ") for line in
                 report.niah_tasks_table(best).splitlines()[2:]]
    assert [r[3] for r in best_rows] == ["3.00e-04", "0.001"]
    assert best_rows[1][5] == "0.100 ± 0.000 (n 3) [best] |"
    # where a new seed should land, at each one's best lr, unmarked: a's passkey 1.0 in
    # every seed gives [1.000, 1.000]; a's mv at 3e-4 0.02 +- 4.302653 x 0.02 x
    # sqrt(4/3) = 0.02 +- 0.099364; b's mv at 1e-3 0.1 in every seed
    new_seed = [line.split(" | ") for line in
                report.niah_new_seed_table(best).splitlines()[2:]]
    assert [r[3:] for r in new_seed] == [
        ["3.00e-04", "[1.000, 1.000] (n 3)", "[-0.079, 0.119] (n 3) |"],
        ["0.001", "[1.000, 1.000] (n 3)", "[0.100, 0.100] (n 3) |"]]
    md = report.markdown(recs, title="t")
    assert "### Every NIAH task with the mixers at one lr" in md
    assert report.NEW_SEED_TITLE in md
    apart = [r for r in recs if r["lr"] != 3e-4]
    assert report.niah_same_lr_table(report.best_lr(apart)) == ""
    assert "with the mixers at one lr" not in report.markdown(apart, title="t")


def test_new_seed_intervals_are_at_least_the_binomial_ones_of_the_examples_scored():
    """Where the records say how many examples (NIAH cells' `examples`) or queries (MQAR's
    `queries`) a value is a fraction of, one more seed's interval is at least the one the
    binomial spread of that many gives (eval.intervals.prediction_interval's trials):
    three seeds at 1.000 no longer give [1.000, 1.000]."""
    def grid(kind, at_train, examples):
        return {"kind": kind, "train_length": 512,
                "cells": [{"length": 512, "depth": d, "exact": at_train,
                           "examples": examples} for d in (0.0, 0.5)]
                + [{"length": 1024, "depth": 0.0, "exact": 0.0, "examples": 7}]}

    recs = [{"task": "niah", "setting": "L512", "mixer": "a", "size": "d8", "lr": 1e-3,
             "seed": seed, "metrics": {"exact": 1.0, "grid": grid("passkey", 1.0, 416),
                                       "grid_mv": grid("mv", mv, 416)}}
            for seed, mv in enumerate((0.0, 0.02, 0.04))]
    rows = [line.split(" | ") for line in
            report.niah_new_seed_table(report.best_lr(recs)).splitlines()[2:]]
    # passkey: 832 examples at the training length (two depths of 416), s = 0: 1.0 +-
    # 1.959964 x 0.00169366 x sqrt(4/3) = 1.0 +- 0.003833; mv: the seeds' spread is
    # larger (0.02 +- 0.099364, as without the examples)
    assert rows == [["| a", "d8", "L512", "0.001", "[0.996, 1.004] (n 3)",
                     "[-0.079, 0.119] (n 3) |"]]
    # a seed whose cells do not say how many examples they scored: no floor, as for MQAR
    del recs[0]["metrics"]["grid"]["cells"][0]["examples"]
    rows = [line.split(" | ") for line in
            report.niah_new_seed_table(report.best_lr(recs)).splitlines()[2:]]
    assert rows[0][4] == "[1.000, 1.000] (n 3)"
    mqar = [_rec("a", "d64", 1e-3, seed, 1.0) for seed in range(3)]
    for r in mqar:
        r["metrics"]["queries"] = 832
    lines = report.by_seed_table(report.best_lr(mqar), "mqar").splitlines()
    assert lines[2].endswith("| [0.996, 1.004] (n 3) |")
    del mqar[0]["metrics"]["queries"]  # a record that does not say: no floor
    lines = report.by_seed_table(report.best_lr(mqar), "mqar").splitlines()
    assert lines[2].endswith("| [1.000, 1.000] (n 3) |")
