"""The statistics of a regression check: McNemar's exact test of pass/fail flips, the paired interval of a mean delta.

Pure functions over counts and numpy arrays. The rules (exact integers up to :data:`MCNEMAR_EXACT_MAX`
discordant rows, log space above; the bootstrap/normal cut-over of the interval) are in docs/regression.md,
"Interval of the mean delta" and "Pass/fail flips".
"""

from __future__ import annotations

import math

import numpy as np

from recall_tasks.analysis.aggregates import BOOTSTRAP_MAX_N, mean_ci

__all__ = ["BOOTSTRAP_MAX_N", "MCNEMAR_EXACT_MAX", "mcnemar_exact_p", "paired_mean_ci"]

MCNEMAR_EXACT_MAX = 20_000
"""Up to this many discordant rows McNemar's p-value is computed with exact integers."""


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of ``min(b, c)`` out of ``b + c`` with p = 1/2.

    ``b`` and ``c`` are the discordant counts (pass→fail and fail→pass). Returns 1.0 when ``b + c == 0``.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    m = min(b, c)
    if n == 0 or 2 * m >= n:
        return 1.0
    if n <= MCNEMAR_EXACT_MAX:
        return _binomial_tail_exact(n, m)
    return _binomial_tail_log(n, m)


def _binomial_tail_exact(n: int, m: int) -> float:
    """``min(1, 2 · Σ_{k≤m} C(n, k) / 2ⁿ)`` with exact integers and one correctly rounded division."""
    term = 1  # C(n, 0)
    total = 1
    for k in range(m):
        term = term * (n - k) // (k + 1)  # C(n, k+1), exact
        total += term
    return min(1.0, (2 * total) / (1 << n))


def _binomial_tail_log(n: int, m: int) -> float:
    """The same tail as :func:`_binomial_tail_exact`, in log space (for large ``n``)."""
    log_pm = math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1) - n * math.log(2.0)
    if m == 0:
        rest = 0.0
    else:
        k = np.arange(m, 0, -1, dtype=np.float64)  # pmf(k-1)/pmf(k) = k / (n-k+1), all < 1 below the mode
        rest = float(np.cumprod(k / (n - k + 1.0)).sum())
    log_p = math.log(2.0) + log_pm + math.log1p(rest)
    return 1.0 if log_p >= 0 else math.exp(log_p)


def paired_mean_ci(deltas: np.ndarray, *, resamples: int = 2000, seed: int = 0) -> tuple[float | None, float | None]:
    """95 % interval of the mean of paired row-level ``deltas``: resampling the deltas keeps the pairing.

    Same estimator as the run-level interval (:func:`recall_tasks.analysis.aggregates.mean_ci`).
    """
    return mean_ci(np.asarray(deltas, dtype=np.float64), seed=seed, resamples=resamples)
