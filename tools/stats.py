"""The statistics of a bench: per-label timing summaries and the speedup's confidence interval."""

from __future__ import annotations

import math
import random
import statistics

from tools.results import SpeedupCI, TimingStats

BOOTSTRAP = 2000


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(label: str, times_ms: list[float], flops: float | None, nbytes: float | None) -> TimingStats:
    med = statistics.median(times_ms)
    return TimingStats(label=label, median_ms=med, p10_ms=quantile(times_ms, 0.1), p90_ms=quantile(times_ms, 0.9),
                       mean_ms=statistics.fmean(times_ms), reps=len(times_ms),
                       tflops=flops / (med * 1e-3) / 1e12 if flops and med > 0 else None,
                       gbps=nbytes / (med * 1e-3) / 1e9 if nbytes and med > 0 else None)


def speedup_ci(ratios: list[float], confidence: float = 0.95, seed: int = 20261121) -> SpeedupCI:
    """Median of paired per-round ratios with a 95% interval (deterministic).

    The interval is the percentile bootstrap of the median, widened where needed to the
    distribution-free order-statistic interval of the median (binomial): with 8-10 rounds the
    bootstrap alone covers only about 93% (it spans roughly the 2nd to the 7th of 8 values), and an
    interval that undercovers would let noise pass as a speedup.
    """
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP))
    a = (1 - confidence) / 2
    lo, hi = order_stat_interval(sorted(ratios), confidence)
    return SpeedupCI(median=statistics.median(ratios), low=min(quantile(meds, a), lo),
                     high=max(quantile(meds, 1 - a), hi), confidence=confidence, rounds=len(ratios))


def order_stat_interval(xs: list[float], confidence: float) -> tuple[float, float]:
    """(x_k, x_{n-k+1}) with the largest k whose coverage of the median, 1 - 2 P(Bin(n, 1/2) < k), is
    at least `confidence` (k = 1, the full range, when no k reaches it)."""
    n = len(xs)
    k, cdf = 1, 0.0
    for j in range(1, n // 2 + 1):
        cdf += math.comb(n, j - 1) / 2 ** n       # P(Bin < j)
        if 1 - 2 * cdf < confidence:
            break
        k = j
    return xs[k - 1], xs[n - k]
