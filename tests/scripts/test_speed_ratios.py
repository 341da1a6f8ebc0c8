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
