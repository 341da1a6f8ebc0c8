"""eval.plots: one colour per mixer."""
from eval import plots


def test_mixer_colors_distinct_up_to_twenty():
    for n in (1, 10, 11, 20):
        names = [f"m{i}" for i in range(n)]
        colors = plots.mixer_colors(names)
        assert set(colors) == set(names)
        assert len(set(colors.values())) == n, n

