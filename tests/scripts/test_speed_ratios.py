"""scripts/speed_ratios: rounds matched by row kind and tag, each mixer's ratio to the base
of its own round, and the t-interval over rounds."""
import json
import math

from scripts.speed_ratios import main, ratios, split_name


def test_names_split_at_the_longest_mixer():
    mixers = {"hedgehog", "hedgehog_window", "gated_deltanet", "deltanet", "softmax"}
    assert split_name("shake_hedgehog_window_r0", mixers) == ("shake", "hedgehog_window", "_r0")
    assert split_name("shake_hedgehog_r0", mixers) == ("shake", "hedgehog", "_r0")
    assert split_name("d1024_T8192_gated_deltanet", mixers) == ("d1024_T8192", "gated_deltanet", "")
    assert split_name("nanogpt", mixers) is None


def test_ratios_pair_each_round_with_its_own_base():
    rows = {"shake_softmax_r0": {"tokens_per_s": 100.0}, "shake_based_r0": {"tokens_per_s": 80.0},
            "shake_softmax_r1": {"tokens_per_s": 200.0}, "shake_based_r1": {"tokens_per_s": 170.0},
            "shake_based_r2": {"tokens_per_s": 90.0},  # no softmax in round 2: left out
            "shake_softmax_r3": {"tokens_per_s": 100.0},
            "shake_based_r3": {"failed": "error"}}     # a failed row: left out
    assert ratios(rows, "softmax") == {("shake", "based"): [0.8, 0.85]}


def test_table_interval(tmp_path, capsys):
    rows = {f"shake_{m}_r{i}": {"tokens_per_s": v}
            for i, (s, b) in enumerate([(100.0, 80.0), (100.0, 85.0), (100.0, 90.0)])
            for m, v in (("softmax", s), ("based", b))}
    (tmp_path / "train_speed.json").write_text(json.dumps(rows))
    main([str(tmp_path)])
    out = capsys.readouterr().out
    # mean 0.85, sample sd 0.05, t(0.975, 2) = 4.302653: half 4.302653 * 0.05 / sqrt(3)
    half = 4.302653 * 0.05 / math.sqrt(3)
    assert f"0.850 [{0.85 - half:.3f}, {0.85 + half:.3f}]" in out
    assert "0.800, 0.850, 0.900" in out


ROUND_ROBIN = """\
rounds: 100%|##########| 10/10 [00:12<00:00,  1.22s/it]
   13.3 wall ms/step (1.00x; range 13.2-13.4), compile 29.2 wall s  model.mixer=softmax data.files=/x/input.txt
   16.1 wall ms/step (1.22x; range 16.1-16.4), compile 24.1 wall s  model.mixer=based data.files=/x/input.txt
   11.1 wall ms/step (0.84x; range 11.1-11.2), compile 18.2 wall s  model.mixer=gated_deltanet model.softmax_every=8 data.files=/x/input.txt
[rc 0 at 99 s]
"""


def test_round_robin_lines_name_variants_by_what_differs():
    from scripts.speed_ratios import step_times
    assert step_times(ROUND_ROBIN) == {"softmax": 13.3, "based": 16.1,
                                       "gated_deltanet model.softmax_every=8": 11.1}


def test_round_robin_files_are_rounds_of_one_row(tmp_path, capsys):
    """Each file is one process: a variant's ratio is the base's ms over its own; files
    timing the same variants (in any order) are rounds of one row."""
    (tmp_path / "rr.txt").write_text(ROUND_ROBIN)
    lines = ROUND_ROBIN.splitlines()
    (tmp_path / "rr2.txt").write_text("\n".join([lines[2], lines[3],
                                                 lines[1].replace("13.3", "14.0")]))
    (tmp_path / "other.txt").write_text("no timings here\n")
    (tmp_path / "call2").mkdir()   # the same file name from another call: one more round
    (tmp_path / "call2" / "rr.txt").write_text(ROUND_ROBIN.replace("16.1", "15.2"))
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| rr | based | 0.875, 0.826, 0.870 |" in out
    assert "| rr | gated_deltanet model.softmax_every=8 | 1.198, 1.198, 1.261 |" in out
