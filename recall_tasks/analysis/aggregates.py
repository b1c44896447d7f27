"""Run-level aggregates: counts, mean/median/p10, pass rate and a 95 % confidence interval of the mean.

Rows not assessed and rows with an error have no score and are never averaged as 0: they are counted in
``skipped`` (``--on-missing skip``), ``not_judged`` (kept from the judge by a budget or the circuit breaker: a table
with a boolean ``not_judged`` column tells them apart, see ``pipeline/commit.py``) and ``errors``. The interval is
a percentile bootstrap (2,000 resamples, fixed seed) up to 20,000 scored rows; above that the bootstrap
distribution of a mean is normal to well within the interval's own noise, so the normal interval is used (it costs
nothing on a 1M-row run).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def summarize(table: pa.Table) -> dict[str, Any]:
    """Aggregate a result table (or any table with the result columns)."""
    rows = table.num_rows
    score = table.column("score")
    scored_mask = pc.is_valid(score)
    scores = pc.filter(score, scored_mask).to_numpy(zero_copy_only=False).astype(float)
    success = pc.filter(table.column("success"), scored_mask)

    def total(name: str) -> float:
        value = pc.sum(table.column(name)).as_py()
        return float(value or 0)

    lo, hi = mean_ci(scores)
    scored = len(scores)
    not_judged = int(pc.sum(table.column("not_judged")).as_py() or 0) if "not_judged" in table.column_names else 0
    return {
        "rows": rows,
        "scored": scored,
        "errors": int(pc.sum(pc.is_valid(table.column("error"))).as_py() or 0),
        "skipped": int(pc.sum(table.column("skipped")).as_py() or 0) - not_judged,
        "not_judged": not_judged,
        "cached": int(pc.sum(table.column("cached")).as_py() or 0),
        "mean_score": float(scores.mean()) if scored else None,
        "median_score": float(np.median(scores)) if scored else None,
        "p10_score": float(np.percentile(scores, 10)) if scored else None,
        "ci_low": lo,
        "ci_high": hi,
        "pass_rate": float(pc.mean(success.cast(pa.float64())).as_py()) if scored else None,
        "prompt_tokens": int(total("prompt_tokens")),
        "completion_tokens": int(total("completion_tokens")),
        "requests": int(total("requests")),
        "cost_usd": total("cost_usd"),
        **_chunk_figures(table, scored_mask),
    }


def _chunk_figures(table: pa.Table, scored: pa.ChunkedArray) -> dict[str, float | None]:
    """Mean context precision and mean share of retrieved chunks used, over scored rows that have them."""
    if "context_precision" not in table.column_names:
        return {"mean_context_precision": None, "chunk_use_rate": None}
    precision = pc.filter(table.column("context_precision"), scored)
    used = pc.cast(pc.filter(table.column("chunks_used"), scored), pa.float64())
    retrieved = pc.cast(pc.filter(table.column("context_count"), scored), pa.float64())
    rate = pc.divide(used, pc.if_else(pc.greater(retrieved, 0), retrieved, None))
    return {"mean_context_precision": pc.mean(precision).as_py(), "chunk_use_rate": pc.mean(rate).as_py()}


def summarize_segments(table: pa.Table, column: str) -> list[tuple[str | None, dict[str, Any]]]:
    """One aggregate per value of ``column`` (null is its own segment)."""
    values = table.column(column)
    out: list[tuple[str | None, dict[str, Any]]] = []
    for value in pc.unique(values).to_pylist():
        mask = pc.is_null(values) if value is None else pc.fill_null(pc.equal(values, value), False)
        out.append((None if value is None else str(value), summarize(table.filter(mask))))
    out.sort(key=lambda item: (item[0] is None, item[0] or ""))
    return out
