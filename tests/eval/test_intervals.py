"""eval.intervals against hand-computed t-intervals and a printed t-table."""
import math

import pytest

from eval import intervals
from eval.intervals import Interval


# t(0.975, df) as printed t-tables give it (3 decimals), e.g. any statistics textbook's.
PRINTED = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228,
           20: 2.086, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980, 10 ** 6: 1.960}


@pytest.mark.parametrize("df,want", sorted(PRINTED.items()))
def test_t_quantiles_match_a_printed_table(df, want):
    assert intervals.t975(df) == pytest.approx(want, abs=5e-4)


def test_t_quantiles_against_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")  # not a dependency: a cross-check only
    for df in list(range(1, 61)) + [75, 100, 250, 1000]:
        assert intervals.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-6), df


def test_t_quantiles_fall_towards_the_normal_one():
    qs = [intervals.t975(df) for df in range(1, 200)]
    assert all(a > b for a, b in zip(qs, qs[1:]))
    assert qs[-1] > intervals.Z975
    with pytest.raises(ValueError, match="df=0"):
        intervals.t975(0)


def test_three_seeds_by_hand():
    # 0.8, 0.9, 1.0: mean 0.9, s = 0.1, se = 0.1 / sqrt(3) = 0.0577350,
    # half = 4.302653 * 0.0577350 = 0.2484138
    iv = intervals.mean_interval([0.8, 0.9, 1.0])
    assert iv.n == 3 and iv.mean == pytest.approx(0.9, abs=1e-15)
    assert iv.half == pytest.approx(0.2484138, abs=1e-7)
    assert (iv.lo, iv.hi) == pytest.approx((0.6515862, 1.1484138), abs=1e-7)


def test_four_values_by_hand_and_nan_left_out():
    # 1, 2, 3, 4: mean 2.5, s^2 = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, se = 0.6454972,
    # half = 3.182446 * 0.6454972 = 2.0542601; the NaN (a diverged seed) is not counted
    iv = intervals.mean_interval([1, 2, float("nan"), 3, 4, None])
    assert iv.n == 4 and iv.mean == 2.5
    assert iv.half == pytest.approx(2.0542601, abs=1e-7)


def test_one_value_has_no_interval_and_none_is_nan():
    one = intervals.mean_interval([0.7])
    assert one.n == 1 and one.mean == 0.7 and math.isnan(one.half) and not one.decided
    none = intervals.mean_interval([float("nan")])
    assert none.n == 0 and math.isnan(none.mean)
    same = intervals.mean_interval([0.5, 0.5, 0.5])
    assert same.half == 0.0 and same.decided
    assert intervals.fmt(one) == "0.700 (n 1, no interval)"
    assert intervals.fmt(intervals.mean_interval([0.8, 0.9, 1.0])) == "0.900 ± 0.248 (n 3)"


def test_ties_are_overlapping_intervals():
    a = Interval(0.90, 0.05, 3)    # [0.85, 0.95]
    b = Interval(0.82, 0.04, 3)    # [0.78, 0.86]: overlaps a
    c = Interval(0.70, 0.05, 3)    # [0.65, 0.75]: below a and b
    d = Interval(0.80, 0.05, 3)    # [0.75, 0.85]: touches a at 0.85 and c at 0.75
    assert intervals.compare(a, b) == "tie" and intervals.compare(b, a) == "tie"
    assert intervals.compare(a, c) == "better" and intervals.compare(c, a) == "worse"
    assert intervals.compare(a, d) == "tie" and intervals.compare(d, c) == "tie"
    # lower is better (a loss): the lower interval wins
    assert intervals.compare(c, a, higher_is_better=False) == "better"
    assert intervals.compare(Interval(0.9, math.nan, 1), c) == "undecided"


def test_marks_of_a_column():
    pts = [Interval(0.82, 0.04, 3), Interval(0.90, 0.05, 3), Interval(0.70, 0.05, 3),
           Interval(0.99, math.nan, 1), Interval(math.nan, math.nan, 0)]
    # the single-seed 0.99 has the best mean: nothing is decided against it
    assert intervals.marks(pts) == ["?", "?", "?", "best", ""]
    assert intervals.marks(pts[:3]) == ["tie", "best", ""]
    assert intervals.marks(pts[:3], higher_is_better=False) == ["", "", "best"]


def test_a_new_seeds_interval_by_hand():
    # 0.8, 0.9, 1.0: s = 0.1, half = 4.302653 * 0.1 * sqrt(1 + 1/3) = 0.4968276
    iv = intervals.prediction_interval([0.8, 0.9, 1.0])
    assert iv.n == 3 and iv.mean == pytest.approx(0.9, abs=1e-15)
    assert iv.half == pytest.approx(0.4968276, abs=1e-7)
    assert math.isnan(intervals.prediction_interval([0.5]).half)


@pytest.mark.parametrize("n", [3, 5])
def test_a_new_seed_lands_in_its_interval_95_percent_of_the_time(n):
    # Normal draws: the next draw falls inside the prediction interval of the n before
    # it with probability 0.95 exactly; the mean's interval covers it far less often.
    np = pytest.importorskip("numpy")
    draws = np.random.default_rng(n).normal(2.0, 0.3, size=(20_000, n + 1))
    inside = [intervals.prediction_interval(d[:n]) for d in draws]
    hits = np.mean([iv.lo <= d[n] <= iv.hi for iv, d in zip(inside, draws)])
    assert hits == pytest.approx(0.95, abs=0.005)
    means = [intervals.mean_interval(d[:n]) for d in draws]
    assert np.mean([iv.lo <= d[n] <= iv.hi for iv, d in zip(means, draws)]) < 0.9


def test_binomial_spread_by_hand():
    # 1.000 over 832 examples: p = (832 + 2) / 836 = 0.9976077, p (1 - p) / 832 =
    # 2.86848e-6, sd 0.00169366; 0.5 over 96: p = 50 / 100, sqrt(0.25 / 96) = 0.0510310
    assert intervals.binomial_spread(1.0, 832) == pytest.approx(0.00169366, rel=1e-5)
    assert intervals.binomial_spread(0.5, 96) == pytest.approx(0.0510310, rel=1e-5)
    with pytest.raises(ValueError, match="trials"):
        intervals.binomial_spread(0.5, 0)


def test_a_new_seeds_interval_is_at_least_the_binomial_one():
    # three seeds at 1.000 over 832 examples each: s = 0, so the binomial spread sets it,
    # 1.959964 x 0.00169366 x sqrt(4/3) = 0.00383308
    iv = intervals.prediction_interval([1.0, 1.0, 1.0], trials=832)
    assert iv.half == pytest.approx(0.00383308, rel=1e-5)
    assert intervals.prediction_interval([1.0, 1.0, 1.0]).half == 0.0
    # where the seeds spread more than the examples do, the seeds' interval stands
    assert intervals.prediction_interval([0.8, 0.9, 1.0], trials=832).half == (
        pytest.approx(0.4968276, abs=1e-7))
    assert math.isnan(intervals.prediction_interval([0.5], trials=832).half)


def test_the_binomial_floor_holds_a_new_seed_near_the_ceiling():
    # Accuracies of 500 examples at p = 0.998 and no spread between seeds: three seeds
    # often agree exactly, and the t-interval of their spread alone then misses the next
    # one more than 5% of the time; with the floor it holds it at least 95% of the time.
    np = pytest.importorskip("numpy")
    draws = np.random.default_rng(3).binomial(500, 0.998, size=(20_000, 4)) / 500

    def coverage(trials):
        ivs = [intervals.prediction_interval(d[:3], trials=trials) for d in draws]
        return np.mean([iv.lo <= d[3] <= iv.hi for iv, d in zip(ivs, draws)])
    assert coverage(None) < 0.93
    assert coverage(500) >= 0.95


def test_fisher_exact_by_hand():
    """Fisher's tea tasting: 3 of 4 cups right against 1 of 4. With 4 successes in 8,
    the first group's count k has probabilities C(4, k) C(4, 4 - k) / 70 = 1, 16, 36, 16,
    1 (/ 70); the observed 16 and every count no likelier: 34 / 70 = 17 / 35."""
    assert intervals.fisher_exact(3, 4, 1, 4) == pytest.approx(17 / 35, rel=1e-12)
    # 1 of 6 against 6 of 6: C(7, k) C(5, 6 - k) / 924 for k = 1..6 is 7, 105, 350, 350,
    # 105, 7; k = 1 and k = 6 are the tables no likelier than the observed: 14 / 924
    assert intervals.fisher_exact(1, 6, 6, 6) == pytest.approx(14 / 924, rel=1e-12)
    # 5 of 6 against 6 of 6 (issue 18's hybrid against softmax): nothing told apart
    assert intervals.fisher_exact(5, 6, 6, 6) == 1.0
    assert intervals.fisher_exact(0, 0, 0, 0) == 1.0
    with pytest.raises(ValueError, match="group b has 4 successes of 3"):
        intervals.fisher_exact(1, 2, 4, 3)


def test_fisher_exact_is_symmetric_and_against_scipy_where_installed():
    cases = [(a, na, b, nb) for na in range(6) for nb in range(6)
             for a in range(na + 1) for b in range(nb + 1) if na + nb]
    for a, na, b, nb in cases:
        p = intervals.fisher_exact(a, na, b, nb)
        assert 0.0 < p <= 1.0
        assert p == pytest.approx(intervals.fisher_exact(b, nb, a, na), rel=1e-9)
        assert p == pytest.approx(intervals.fisher_exact(na - a, na, nb - b, nb), rel=1e-9)
    stats = pytest.importorskip("scipy.stats")
    for a, na, b, nb in cases:
        want = stats.fisher_exact([[a, na - a], [b, nb - b]]).pvalue
        assert intervals.fisher_exact(a, na, b, nb) == pytest.approx(want, rel=1e-9, abs=1e-15)
