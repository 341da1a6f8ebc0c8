"""Confidence intervals over seeds, and when two results are a tie.

A point of a comparison (a mixer at a width and a setting, at its best lr) is the mean
of its seeds' results with a two-sided 95% Student-t interval,

    mean +- t(0.975, n - 1) * s / sqrt(n),    s the sample standard deviation (n - 1),

the interval a reviewer reads from "mean over n seeds". Two points whose intervals
overlap are a tie: the table does not rank them. One seed gives no interval (its
half-width is NaN), and such a point is never ranked against another: "not decided".

No scipy: t(0.975, df) is tabulated for df 1-30 (to 6 decimals, the values of any
t-table: 12.706205 at df 1, 4.302653 at 2, 2.042272 at 30) and, past 30, the
Cornish-Fisher expansion in 1/df around the normal quantile 1.959964 (within 1e-7 of
the exact quantile there).
"""
from __future__ import annotations

import math
from typing import Iterable, NamedTuple, Sequence

# t(0.975, df) for df = 1..30.
T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
        2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
        2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
        2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
Z975 = 1.959963984540054  # the normal quantile, df -> infinity


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t quantile: df={df}; an interval needs at least 2 values")
    if df <= len(T975):
        return T975[df - 1]
    z, v = Z975, float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z)
            / (92160 * v ** 4))


class Interval(NamedTuple):
    """mean +- half over n values; half is NaN for n < 2 (no interval)."""
    mean: float
    half: float
    n: int

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def decided(self) -> bool:
        """Whether there is an interval at all (n >= 2, finite)."""
        return self.n >= 2 and math.isfinite(self.half)


def mean_interval(values: Iterable[float]) -> Interval:
    """The 95% t-interval of the mean of the finite `values` (NaNs, e.g. a diverged
    run's, are left out: n counts what is averaged). No finite value: mean NaN, n 0."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Interval(math.nan, math.nan, 0)
    mean = math.fsum(vals) / n
    if n == 1:
        return Interval(mean, math.nan, 1)
    var = math.fsum((v - mean) ** 2 for v in vals) / (n - 1)
    return Interval(mean, t975(n - 1) * math.sqrt(var / n), n)


def prediction_interval(values: Iterable[float], trials: int | None = None) -> Interval:
    """Where one more seed's value should land, 95%: mean +- t(0.975, n - 1) * s *
    sqrt(1 + 1/n) over the finite `values` (the new value's own spread s beside the
    mean's s / sqrt(n)). A re-run with an unused seed is checked against this interval,
    not the mean's: at n 3 the mean's interval holds a new seed only about 5 times in 6.
    Both assume the seeds' values are normal; an early stop (MQAR's at 0.99) bunches
    them below 1, so read it as approximate there. Fewer than 2 values: half NaN.

    trials: where each value is a fraction of `trials` examples scored right or wrong
    (an accuracy), the half-width is at least the one the binomial spread alone gives,
    Z975 * binomial_spread(mean, trials) * sqrt(1 + 1/n) (a known spread: the normal
    quantile, not t): a new seed's value varies at least by which of its examples it
    gets wrong, and a few seeds that agree by chance (three at 1.000) understate that
    spread. Seeds that differ more than their examples do are untouched."""
    iv = mean_interval(values)
    if not iv.decided:
        return Interval(iv.mean, math.nan, iv.n)
    half = iv.half * math.sqrt(iv.n)  # t * s
    if trials:
        half = max(half, Z975 * binomial_spread(iv.mean, trials))
    return Interval(iv.mean, half * math.sqrt(1 + 1 / iv.n), iv.n)


def binomial_spread(fraction: float, trials: int) -> float:
    """The standard deviation of the fraction right of `trials` independent examples
    each right with probability p, sqrt(p (1 - p) / trials), at Agresti and Coull's
    p = (fraction * trials + 2) / (trials + 4): never 0, so a fraction of 1.000 over
    2,496 examples still has one (0.0006), as the exact binomial's interval does."""
    if trials < 1:
        raise ValueError(f"binomial_spread: trials={trials}; need at least one example")
    p = (min(max(fraction, 0.0), 1.0) * trials + 2) / (trials + 4)
    return math.sqrt(p * (1 - p) / trials)


def overlap(a: Interval, b: Interval) -> bool:
    """Whether the two intervals share a point (touching counts: a tie)."""
    return a.lo <= b.hi and b.lo <= a.hi


def compare(a: Interval, b: Interval, higher_is_better: bool = True) -> str:
    """"better", "worse" (a against b, the intervals apart), "tie" (they overlap) or
    "undecided" (either has no interval: fewer than 2 seeds)."""
    if not (a.decided and b.decided):
        return "undecided"
    if overlap(a, b):
        return "tie"
    a_above = a.lo > b.hi
    return "better" if a_above == higher_is_better else "worse"


def marks(points: Sequence[Interval], higher_is_better: bool = True) -> list[str]:
    """A mark per point of one column: "best" for the best mean, "tie" for a point whose
    interval overlaps the best's, "" for one decidedly behind it, "?" where either has
    no interval (fewer than 2 seeds; NaN means are left unmarked)."""
    finite = [i for i, p in enumerate(points) if math.isfinite(p.mean)]
    if not finite:
        return [""] * len(points)
    key = (lambda i: points[i].mean) if higher_is_better else (lambda i: -points[i].mean)
    top = max(finite, key=key)
    out = []
    for i, p in enumerate(points):
        if i == top:
            out.append("best")
        elif i not in finite:
            out.append("")
        else:
            verdict = compare(p, points[top], higher_is_better)
            out.append({"tie": "tie", "undecided": "?"}.get(verdict, ""))
    return out


def fisher_exact(successes_a: int, n_a: int, successes_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test that two groups succeed equally often (e.g.
    seeds that learned a task: 5 of 6 against 6 of 6). With the margins fixed, the first
    group's count is hypergeometric; p sums the probabilities of every count no more
    likely than the one observed (the usual two-sided rule, with a relative tolerance of
    1e-7 for ties in probability). A success fraction needs many runs: 0 of 6 failures
    against 1 of 6 gives p 1."""
    for name, k, n in (("a", successes_a, n_a), ("b", successes_b, n_b)):
        if not 0 <= k <= n:
            raise ValueError(f"fisher_exact: group {name} has {k} successes of {n}")
    total, successes = n_a + n_b, successes_a + successes_b
    if total == 0:
        return 1.0

    def prob(k: int) -> float:
        return (math.comb(successes, k) * math.comb(total - successes, n_a - k)
                / math.comb(total, n_a))
    observed = prob(successes_a)
    lo, hi = max(0, n_a - (total - successes)), min(n_a, successes)
    p = math.fsum(q for q in map(prob, range(lo, hi + 1)) if q <= observed * (1 + 1e-7))
    return min(1.0, p)


def fmt(iv: Interval, digits: int = 3) -> str:
    """"0.912 ± 0.031 (n 3)"; one value: "0.912 (n 1, no interval)"."""
    if iv.n == 0:
        return "-"
    if not iv.decided:
        return f"{iv.mean:.{digits}f} (n {iv.n}, no interval)"
    return f"{iv.mean:.{digits}f} ± {iv.half:.{digits}f} (n {iv.n})"
