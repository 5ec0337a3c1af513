"""Statistics of a trial's repeated runs: the median, its interval, the spreads, and ties.

The runs of a trial are independent measurements of one configuration, each in fresh worker
processes. Their step times are summarised as Hoefler & Belli recommend for performance
measurements ("Scientific Benchmarking of Parallel Computing Systems", SC'15): the median,
with a nonparametric confidence interval of the median from order statistics. It assumes
nothing about the distribution of the times (interference makes them skewed, not normal).

Interval of the median. With the times sorted, x(1) <= ... <= x(n), the interval
[x(j), x(n+1-j)] misses the true median only when fewer than j runs fall below it or fewer
than j above it, so it covers the median with probability

    coverage(n, j) = P(j <= B <= n - j) = 1 - 2 * P(B <= j - 1),   B ~ Binomial(n, 1/2).

`median_interval` takes the narrowest such interval whose coverage reaches the level asked
(95%). When even [min, max] falls short, it returns [min, max] with the coverage it really has,
1 - 2 / 2^n: 50% at n = 2, 75% at n = 3, 93.75% at n = 5; six runs are the fewest that give
95% (96.9%). A single run has no interval: [x, x] covers the median with probability 0.

Two configurations are tied when their intervals overlap: the runs cannot tell which is
faster. When they do not overlap, both intervals hold their medians with probability at
least c1 + c2 - 1 (Bonferroni), so the order of the two holds with at least that confidence
(`separation`). Below 9 runs a 95% interval is [min, max], which more runs only widen: once
two such intervals overlap, repeating them cannot separate them (`bound_to_overlap`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
"""The confidence asked of an interval of the median."""


@dataclass(frozen=True)
class Interval:
    """An interval of a median: [lo, hi], covering it with probability `level`, from `n` runs."""

    lo: float
    hi: float
    level: float
    n: int

    def overlaps(self, other: Interval) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def coverage(n: int, j: int) -> float:
    """Probability that [x(j), x(n+1-j)] of n sorted runs holds the median (1 <= j <= (n+1)/2)."""
    below = sum(math.comb(n, i) for i in range(j))  # outcomes with fewer than j runs below the median
    return 1 - 2 * below / 2**n


def order(n: int, level: float = LEVEL) -> int:
    """The j of the narrowest interval [x(j), x(n+1-j)] of n runs that reaches `level` (1: [min, max])."""
    j = 1
    while j + 1 <= (n + 1) // 2 and coverage(n, j + 1) >= level:
        j += 1
    return j


def median_interval(xs: Sequence[float], level: float = LEVEL) -> Interval:
    """The narrowest order-statistic interval of the median reaching `level`, else [min, max] with its own coverage."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("no runs: an interval needs at least one")
    j = order(n, level)
    return Interval(s[j - 1], s[n - j], coverage(n, j), n)


def bound_to_overlap(a: Sequence[float], b: Sequence[float], cap: int, level: float = LEVEL) -> bool:
    """Whether the intervals of runs `a` and `b` overlap however the runs still to come turn out,
    as long as neither gets more than `cap` runs.

    A further run never raises the j-th smallest time nor lowers the j-th largest, and the j
    of an interval only grows with the runs (`order`). So up to `cap` runs the interval always
    holds [j-th smallest, j-th largest] of the runs so far, j = order(cap); when those of `a`
    and `b` overlap, no number of runs up to the cap can separate them. With j = 1 (a cap below
    9 runs at 95%) that core is [min, max]: an overlap of [min, max] intervals never closes."""
    j = order(cap, level)
    sa, sb = sorted(a), sorted(b)
    if len(sa) < 2 * j - 1 or len(sb) < 2 * j - 1:
        return False  # too few runs for a core: more runs may still separate them
    return sa[j - 1] <= sb[-j] and sb[j - 1] <= sa[-j]


def runs_for_level(level: float = LEVEL) -> int:
    """The fewest runs whose [min, max] covers the median with at least `level`."""
    n = 1
    while coverage(n, 1) < level:
        n += 1
    return n


def between_std(xs: Sequence[float]) -> float | None:
    """Spread between runs: the sample standard deviation of their step times (None for one run)."""
    return statistics.stdev(xs) if len(xs) > 1 else None


def pooled_std(stds: Sequence[float]) -> float:
    """Spread within runs of equal length: the root mean square of each run's standard deviation."""
    return math.sqrt(statistics.fmean([s * s for s in stds]))


def narrow_enough(xs: Sequence[float], width: float, level: float = LEVEL) -> bool:
    """Whether the interval of the median reaches `level` and is at most `width` of the median wide."""
    iv = median_interval(xs, level)
    return iv.level >= level and iv.hi - iv.lo <= width * median(xs)


def separation(a: Interval, b: Interval) -> float:
    """Confidence that the medians are ordered as their intervals are: 0 when they overlap."""
    if a.overlaps(b):
        return 0.0
    return max(0.0, a.level + b.level - 1)
