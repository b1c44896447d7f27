"""Run-level aggregates' interval: a 95 % confidence interval of the mean (the counts, mean/median/p10 and pass
rate are gathered batch by batch: ``analysis/tally.py``).

Rows not assessed and rows with an error have no score and are never averaged as 0: they are counted in
``skipped`` (``--on-missing skip``), ``not_judged`` (kept from the judge by a budget or the circuit breaker: a batch
with a boolean ``not_judged`` column tells them apart, see ``pipeline/commit.py``) and ``errors``. The interval is
a percentile bootstrap (2,000 resamples, fixed seed) up to 20,000 scored rows; above that the bootstrap
distribution of a mean is normal to well within the interval's own noise, so the normal interval is used (it costs
nothing on a 1M-row run).
"""

from __future__ import annotations

import math

import numpy as np

BOOTSTRAP_MAX_N = 20_000
BOOTSTRAP_RESAMPLES = 2_000
MIN_INTERVAL_ROWS = 10
"""Fewest rows (paired rows in a comparison) that a comparison's or a calibration's 95 % interval and verdict are
given for: below it the interval is null with :func:`too_few_rows`' reason (docs/regression.md, "Too few rows")."""


def too_few_rows(n: int, what: str = "") -> str | None:
    """Why ``n`` rows get no interval and no verdict (``what``: " paired"), or None when they are enough."""
    if n >= MIN_INTERVAL_ROWS:
        return None
    return f"too few rows: {n}{what}, an interval needs at least {MIN_INTERVAL_ROWS}"


def mean_ci(
    values: np.ndarray, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float | None, float | None]:
    """95 % interval of the mean of ``values`` (scores, or paired deltas for a regression check).

    Percentile bootstrap up to :data:`BOOTSTRAP_MAX_N` values, drawn in blocks of ~2M indices to bound memory;
    the normal interval above. ``(None, None)`` for no values; a constant array gives a zero-width interval.
    """
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if n == 0:
        return None, None
    if n == 1 or not np.any(v != v[0]):
        return float(v[0]), float(v[0])
    if n <= BOOTSTRAP_MAX_N:
        if resamples < 1:
            raise ValueError(f"resamples must be >= 1, got {resamples}")
        rng = np.random.default_rng(seed)
        means = np.empty(resamples)
        step = max(1, 2_000_000 // n)
        for start in range(0, resamples, step):
            stop = min(start + step, resamples)
            idx = rng.integers(0, n, size=(stop - start, n))
            means[start:stop] = v[idx].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        return float(lo), float(hi)
    m = float(v.mean())
    half = 1.959963984540054 * float(v.std(ddof=1)) / math.sqrt(n)  # z for 95 %
    return m - half, m + half
