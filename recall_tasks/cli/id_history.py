"""``history --metric recall@10``: the series as one id metric sees it (issue 41 item 6).

The runs' mean and 95 % interval become the metric's (``runs.id_metrics``, ``id_metrics_low``/``_high``; the pass
rate is the judged score's, so it is left out), and each run's verdict is that metric's ``comparisons`` row. Runs
without the metric show no mean. The judged score's history is ``history`` without ``--metric``.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.errors import ConfigError

_NAME = re.compile(r"^(recall|precision|hit_rate|mrr|ndcg)@[1-9][0-9]*$")


def metric_view(runs: pa.Table, comparisons: pa.Table | None, metric: str) -> tuple[pa.Table, pa.Table | None]:
    """``runs`` and ``comparisons`` with ``metric``'s figures in the places ``history`` reads."""
    if not _NAME.match(metric):
        raise ConfigError(f"--metric {metric!r}: expected an id metric such as recall@10, precision@5, ndcg@10")
    if "id_metrics" not in runs.column_names:
        raise ConfigError(f"--metric {metric}: no run of this output has id metrics (docs/usage.md)")

    def lookup(column: str) -> Any:
        return pc.map_lookup(runs.column(column), pa.scalar(metric), "first")

    for name, source in (("mean_score", "id_metrics"), ("ci_low", "id_metrics_low"), ("ci_high", "id_metrics_high")):
        runs = runs.set_column(runs.column_names.index(name), name, lookup(source))
    runs = runs.set_column(runs.column_names.index("pass_rate"), "pass_rate", pa.nulls(runs.num_rows, pa.float64()))
    if comparisons is not None and "metric" in comparisons.column_names:
        mine = comparisons.filter(pc.fill_null(pc.equal(comparisons.column("metric"), metric), False))
        at = mine.column_names.index("metric")  # history reads a run's own row, not an id metric's: this one is
        comparisons = mine.set_column(at, "metric", pa.nulls(mine.num_rows, pa.string()))
    return runs, comparisons
