"""Regression tracking at the end of a run: find the baseline, compare, record, tell.

The comparison lives in :mod:`recall_tasks.analysis.regression` (the rules: docs/regression.md); this module
reads the committed tables, writes the comparison to the ``comparisons`` table (idempotent per comparison id)
and builds the event payloads the flow emits (``recall.run.completed`` always, ``recall.regression.detected``
when the verdict is regressed).
"""

from __future__ import annotations

from typing import Any

import pyarrow.dataset as pads

from recall_tasks.analysis.baseline import earlier_statuses, find_baseline, no_baseline_text, other_series
from recall_tasks.analysis.ids_regression import attach, compare_ids
from recall_tasks.analysis.regression import Comparison, compare_runs
from recall_tasks.analysis.worst_rows import WorstRow, lost_statements
from recall_tasks.summaries import RunRow

RESULT_COLUMNS = ["row_id", "score", "success", "context_precision"]


def _rows_of(results: pads.Dataset, run_id: str, columns: list[str], where: Any = None) -> Any:
    condition = pads.field("run_id") == run_id
    return results.to_table(columns=columns, filter=condition if where is None else condition & where)


def fill_lost(results: pads.Dataset, current_id: str, baseline_id: str, worst: list[WorstRow]) -> None:
    """The statements each of the worst rows lost, with verdict text read for those rows only (~1 KB a row)."""
    ids = [w.row_id for w in worst]
    if not ids or "verdicts" not in results.schema.names:
        return
    where = pads.field("row_id").isin(ids)

    def verdicts_of(run_id: str) -> dict[str, Any]:
        table = _rows_of(results, run_id, ["row_id", "verdicts"], where)
        return dict(zip(table.column("row_id").to_pylist(), table.column("verdicts").to_pylist(), strict=True))

    current, base = verdicts_of(current_id), verdicts_of(baseline_id)
    for w in worst:
        w.lost = lost_statements(base.get(w.row_id), current.get(w.row_id))


def compare_with_baseline(plan: Any, summary: RunRow) -> Comparison | None:
    """Compare the committed run with its baseline (``params.baseline``); None when there is none."""
    spec = plan.params.baseline
    if not spec:
        return None
    runs_ds = plan.store.read_table("runs")
    if runs_ds is None:
        return None
    runs = runs_ds.to_table()
    baseline = find_baseline(
        runs, dataset=plan.dataset.name, metric=plan.params.metric, spec=spec, exclude_run_id=plan.run_id,
        current=summary, dataset_id=plan.dataset.identity,
    )  # fmt: skip
    if baseline is None:
        return None
    results = plan.store.read_table("results")
    columns = [c for c in [*RESULT_COLUMNS, *plan.segment_columns] if c in results.schema.names]
    comparison = compare_runs(
        _rows_of(results, plan.run_id, columns), _rows_of(results, baseline["run_id"], columns),
        current_run=summary, baseline_run=baseline, tolerance=plan.params.tolerance,
        segment_columns=plan.segment_columns,
    )  # fmt: skip
    fill_lost(results, plan.run_id, baseline["run_id"], comparison.worst_rows)
    ids = compare_ids(results, summary, baseline, tolerance=plan.params.tolerance, segment_columns=plan.segment_columns)
    id_rows = attach(comparison, ids, _recall_name(plan.params))  # after: it may add the explanation to the main row
    plan.store.append_comparison(comparison.comparison_id, plan.dataset.name, [*comparison.to_rows(), *id_rows])
    return comparison


def _recall_name(params: Any) -> str:
    """The id recall a judged verdict is set beside: recall at the ``--verdict-metric``'s k."""
    return "recall@" + str(params.verdict_metric).rpartition("@")[2]


def why_no_baseline(plan: Any) -> str:
    """Why a committed run was not compared: ``--baseline none``, the first run of its series (and, when the output
    holds another series of the metric, the ``--dataset-name`` that joins it), or ``no comparable baseline (N
    earlier runs: …)`` when every earlier run failed or was stopped by a budget."""
    if not plan.params.baseline:
        return "not compared (--baseline none)"
    runs_ds = plan.store.read_table("runs")
    if runs_ds is None:
        return "first run of its series"
    columns = ["run_id", "dataset", "metric", "segment_column", "status", "dataset_id", "finished_at"]
    runs = runs_ds.to_table(columns=[c for c in columns if c in runs_ds.schema.names])
    name, metric, identity = plan.dataset.name, plan.params.metric, plan.dataset.identity
    earlier = earlier_statuses(runs, dataset=name, metric=metric, exclude_run_id=plan.run_id, dataset_id=identity)
    why = no_baseline_text(earlier) or "no baseline found"
    others = other_series(runs, dataset=name, metric=metric, dataset_id=identity) if not sum(earlier.values()) else []
    if others:
        shown = ", ".join(others)
        why += (
            f"; this output holds {'another series' if len(others) == 1 else 'other series'} of {metric}: {shown} "
            f"(--dataset-name {others[0]} compares this run with {'it' if len(others) == 1 else others[0]})"
        )
    return why


def largest_drops(store: Any, run_id: str, baseline_id: str, limit: int = 10) -> list[WorstRow]:
    """The rows of ``run_id`` that lost most against ``baseline_id``, with their lost statements (for reports)."""
    results = store.read_table("results")
    if results is None:
        return []
    columns = [c for c in RESULT_COLUMNS if c in results.schema.names]
    current, base = _rows_of(results, run_id, columns), _rows_of(results, baseline_id, columns)
    if current.num_rows == 0 or base.num_rows == 0:
        return []
    comparison = compare_runs(
        current, base, current_run={"run_id": run_id}, baseline_run={"run_id": baseline_id}, worst=limit, resamples=1
    )
    fill_lost(results, run_id, baseline_id, comparison.worst_rows)
    return comparison.worst_rows


def run_event_payload(summary: RunRow) -> dict[str, Any]:
    """The JSON-safe payload of ``recall.run.completed``."""
    keys = ["run_id", "dataset", "dataset_uri", "label", "index_version", "metric", "judge_model", "rows",
            "scored", "errors", "skipped", "cached", "mean_score", "ci_low", "ci_high", "pass_rate", "cost_usd",
            "status", "status_reason", "judge", "error_rate", "canary_id", "canary_accuracy",
            "canary_kappa"]  # fmt: skip
    return {k: summary.get(k) for k in keys}
