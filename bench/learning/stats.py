"""The learning bench's statistics, from scipy: t intervals and the power of a paired t-test.

Two arms run with the same seed share the bootstrap agent, the rollout sampling and
the training order, so the bench compares them by the per-seed differences of their
final success: a one-sample t-test on those differences (the paired t-test).

Power is the probability that the paired 95% interval excludes 0 when the true
difference is ``effect`` and the per-seed differences spread by ``sd``: under the
alternative the t statistic follows a noncentral t with n - 1 degrees of freedom
and noncentrality ``effect / sd * sqrt(n)``. "The interval would exclude 0 if the
mean came out exactly at the effect" is only about 50% power; the bench sizes its
seeds for ``TARGET_POWER`` (80%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

ALPHA = 0.05  # two-sided: 95% intervals
TARGET_POWER = 0.8
MAX_SEEDS = 200  # "more than this many seeds" is all a report needs to say


def t_quantile(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (nan below 1)."""
    from scipy import stats

    return float(stats.t.ppf(1 - ALPHA / 2, df)) if df > 0 else math.nan


def sample_sd(values: Sequence[float]) -> float:
    """The sample standard deviation (n - 1 in the denominator; nan below two values)."""
    import numpy as np

    return float(np.std(values, ddof=1)) if len(values) >= 2 else math.nan


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% t-interval (nan bounds below two values)."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return mean, math.nan, math.nan
    half = t_quantile(n - 1) * sample_sd(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_power(sd: float, effect: float, n: int) -> float:
    """The power of a two-sided paired t-test at ``n`` seeds to find a true difference of
    ``effect`` when the per-seed differences have standard deviation ``sd``."""
    from scipy import stats

    if n < 2 or not sd > 0:
        return math.nan
    df = n - 1
    noncentrality = abs(effect) / sd * math.sqrt(n)
    critical = stats.t.ppf(1 - ALPHA / 2, df)
    return float(
        stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality)
    )


def seeds_for_power(sd: float, effect: float, power: float = TARGET_POWER) -> int | None:
    """The fewest paired seeds with at least ``power`` to find ``effect`` (None: no spread
    measured, no effect, or more than MAX_SEEDS)."""
    if not sd > 0 or effect == 0:
        return None
    for n in range(2, MAX_SEEDS + 1):
        if paired_power(sd, effect, n) >= power:
            return n
    return None
