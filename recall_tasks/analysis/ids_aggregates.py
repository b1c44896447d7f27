"""Run-level figures of the id-based retrieval metrics (issue 41): per metric, the mean over the rows it assessed
and its 95 % interval (the same interval as the judged score's: :func:`~recall_tasks.analysis.aggregates.mean_ci`).

Pure functions over a table with an ``id_metrics`` map column (``results.id_metrics``, see ``io/schemas.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.analysis.aggregates import mean_ci

ID_RUN_KEYS = ("id_rows", "id_metrics", "id_metrics_low", "id_metrics_high")


def no_id_stats() -> dict[str, Any]:
    """The id columns of a run without ids (null)."""
    return dict.fromkeys(ID_RUN_KEYS)


def metric_names(column: pa.ChunkedArray | pa.Array) -> list[str]:
    """The metric names a map column holds, in their first row's order (``recall@1``, ``precision@1``, ...)."""
    if not len(column):
        return []
    entries = pa.list_(pa.struct([("key", pa.string()), ("value", pa.float64())]))
    keys = pc.struct_field(pc.list_flatten(column.cast(entries)), [0])  # a map's keys (a slice's only)
    return [str(k) for k in pc.unique(keys).to_pylist() if k is not None]


def values_of(column: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """One metric's values, NaN where the row did not assess it."""
    found = pc.map_lookup(column, pa.scalar(name), "first")
    return np.asarray(pc.fill_null(pc.cast(found, pa.float64()), np.nan).to_numpy(zero_copy_only=False), np.float64)


def id_stats(table: pa.Table) -> dict[str, Any]:
    """``id_rows``, and per metric the mean and interval bounds (maps keyed by metric name)."""
    if "id_metrics" not in table.column_names:
        return no_id_stats()
    column = table.column("id_metrics")
    names = metric_names(column)
    means: dict[str, float] = {}
    lows: dict[str, float] = {}
    highs: dict[str, float] = {}
    for name in names:
        values = values_of(column, name)
        values = values[~np.isnan(values)]
        if not len(values):
            continue
        lo, hi = mean_ci(values)
        means[name] = float(values.mean())
        if lo is not None and hi is not None:
            lows[name], highs[name] = lo, hi
    return {
        "id_rows": int(pc.sum(pc.is_valid(column)).as_py() or 0),
        "id_metrics": means or None,
        "id_metrics_low": lows or None,
        "id_metrics_high": highs or None,
    }
