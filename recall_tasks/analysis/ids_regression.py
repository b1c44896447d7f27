"""Regression checks of the id-based retrieval metrics (issue 41 item 5): each id metric of a run compared with its
baseline's as the judged score is (:func:`~recall_tasks.analysis.regression.compare_runs`: rows paired by row id,
the interval of the mean difference, the tolerance, McNemar on the flips of hit@k), one ``comparisons`` row per
metric (``metric = 'recall@10'``, ...) under the run's comparison id.

The run's verdict stays one metric's: the judged score's in a judged run, ``--verdict-metric``'s in a
``retrieval_ids`` run (its ``score``); the other metrics are reported, never alerted on. When the judged verdict and
id recall disagree, the comparison says which moved (:func:`explain`). The rules are in docs/regression.md,
"Id-based retrieval metrics".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from recall_tasks.analysis.ids_aggregates import metric_names, values_of
from recall_tasks.analysis.regression import Comparison, compare_runs

#: what must match for two runs' id metrics to be compared: the rows (not the judge, which they never see)
_ID_RUN_KEYS = ("run_id", "dataset", "dataset_id", "dataset_uri", "row_identity")

JUDGE_MAY_HAVE_CHANGED = "id-based recall is unchanged; the judge may have changed (run with --canary)"


def index_lost(name: str) -> str:
    """The reverse of :data:`JUDGE_MAY_HAVE_CHANGED`: the ids moved, the judged score did not."""
    return (
        f"judged recall is unchanged but id-based {name} regressed: the index lost relevant documents whose content "
        "the judge found in other chunks, or the relevant ids changed"
    )


def _run_of(run: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {**{k: run.get(k) for k in _ID_RUN_KEYS}, "metric": name}


def _table(rows: pa.Table, name: str, segments: Sequence[str]) -> pa.Table:
    """One metric's rows as ``compare_runs`` reads them: ``score`` the value, ``success`` a relevant id in the top k."""
    values = values_of(rows.column("id_metrics"), name)
    scored = ~np.isnan(values)
    score = pa.array(values, pa.float64(), mask=~scored)
    success = pa.array(values > 0, pa.bool_(), mask=~scored)
    table = pa.table({"row_id": rows.column("row_id"), "score": score, "success": success})
    for column in segments:
        if column in rows.column_names:
            table = table.append_column(column, rows.column(column))
    return table


def compare_ids(
    results: pads.Dataset,
    current_run: Mapping[str, Any],
    baseline_run: dict[str, Any],
    *,
    tolerance: float,
    segment_columns: Sequence[str] = (),
) -> list[Comparison]:
    """One comparison per id metric both runs have (none when either run has no id metrics)."""
    if "id_metrics" not in results.schema.names:
        return []
    columns = ["row_id", "id_metrics", *[c for c in segment_columns if c in results.schema.names]]

    def rows_of(run_id: str) -> pa.Table:
        return results.to_table(columns=columns, filter=pads.field("run_id") == run_id)

    current, baseline = rows_of(str(current_run["run_id"])), rows_of(str(baseline_run["run_id"]))
    names = [n for n in metric_names(current.column("id_metrics")) if n in metric_names(baseline.column("id_metrics"))]
    return [
        compare_runs(
            _table(current, name, segment_columns),
            _table(baseline, name, segment_columns),
            current_run=_run_of(current_run, name),
            baseline_run=_run_of(baseline_run, name),
            tolerance=tolerance,
            segment_columns=[c for c in segment_columns if c in columns],
            worst=0,
        )  # fmt: skip
        for name in names
    ]


def _holds_zero(c: Comparison) -> bool:
    return c.ci_low is not None and c.ci_high is not None and c.ci_low <= 0 <= c.ci_high


def explain(main: Comparison, ids: list[Comparison], recall_name: str) -> str | None:
    """The sentence when a judged run's verdict and id recall (``recall_name``, e.g. ``recall@10``) disagree."""
    if main.metric == "retrieval_ids":
        return None
    recall = next((c for c in ids if c.metric == recall_name), None)
    if recall is None or recall.verdict in ("incomparable", "no_overlap", "too_few_rows"):
        return None
    if main.verdict == "regressed" and _holds_zero(recall):
        return JUDGE_MAY_HAVE_CHANGED
    if recall.verdict == "regressed" and main.verdict == "unchanged" and _holds_zero(main):
        return index_lost(recall_name)
    return None


def attach(main: Comparison, ids: list[Comparison], recall_name: str) -> list[dict[str, Any]]:
    """The id metrics' ``comparisons`` rows (under ``main``'s comparison id); the explanation, if any, goes to
    ``main``'s warnings and reason (when it has none) and to the id recall row's reason."""
    sentence = explain(main, ids, recall_name)
    rows: list[dict[str, Any]] = []
    for c in ids:
        c.baseline_run_id, c.current_run_id = main.baseline_run_id, main.current_run_id
        for row in c.to_rows():
            if sentence is not None and c.metric == recall_name and row["segment_column"] is None:
                row["reason"] = row["reason"] or sentence
            row["dataset"] = main.dataset
            rows.append(row)
    if sentence is not None:
        main.warnings.append(sentence)
        main.reason = main.reason or sentence
    return rows
