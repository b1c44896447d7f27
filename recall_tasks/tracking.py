"""Regression tracking at the end of a run: find the baseline, compare, record, tell.

The statistics live in :mod:`recall_tasks.regression`; this module reads the committed tables, writes the
comparison to the ``comparisons`` table (idempotent per comparison id) and builds the event payloads the
flow emits (``recall.run.completed`` always, ``recall.regression.detected`` when the verdict is regressed).
"""

from __future__ import annotations

from typing import Any

import pyarrow.dataset as pads

from recall_tasks.regression import Comparison, compare_runs, find_baseline, lost_statements

RESULT_COLUMNS = ["row_id", "score", "success"]


def compare_with_baseline(plan: Any, summary: dict[str, Any]) -> Comparison | None:
    """Compare the committed run with its baseline (``params.baseline``); None when there is none."""
    spec = plan.params.baseline
    if not spec:
        return None
    runs_ds = plan.store.read_table("runs")
    if runs_ds is None:
        return None
    runs = runs_ds.to_table()
    baseline = find_baseline(
        runs,
        dataset=plan.dataset.name,
        metric=plan.params.metric,
        spec=spec,
        exclude_run_id=plan.run_id,
        current=summary,
    )
    if baseline is None:
        return None
    results = plan.store.read_table("results")
    columns = [c for c in [*RESULT_COLUMNS, *plan.segment_columns] if c in results.schema.names]

    def rows_of(run_id: str, cols: list[str], where: Any = None) -> Any:
        condition = pads.field("run_id") == run_id
        return results.to_table(columns=cols, filter=condition if where is None else condition & where)

    comparison = compare_runs(
        rows_of(plan.run_id, columns), rows_of(baseline["run_id"], columns), current_run=summary,
        baseline_run=baseline, tolerance=plan.params.tolerance, segment_columns=plan.segment_columns,
    )  # fmt: skip
    # Verdict text only for the worst rows (a few bytes per row above; ~1 KB per row with verdicts).
    ids = [w.row_id for w in comparison.worst_rows]
    if ids and "verdicts" in results.schema.names:
        where = pads.field("row_id").isin(ids)

        def verdicts_of(run_id: str) -> dict[str, Any]:
            table = rows_of(run_id, ["row_id", "verdicts"], where)
            return dict(zip(table.column("row_id").to_pylist(), table.column("verdicts").to_pylist(), strict=True))

        current, base = verdicts_of(plan.run_id), verdicts_of(baseline["run_id"])
        for w in comparison.worst_rows:
            w.lost = lost_statements(base.get(w.row_id), current.get(w.row_id))
    plan.store.append_comparison(comparison.comparison_id, plan.dataset.name, comparison.to_rows())
    return comparison


def run_event_payload(summary: dict[str, Any]) -> dict[str, Any]:
    """The JSON-safe payload of ``recall.run.completed``."""
    keys = ["run_id", "dataset", "dataset_uri", "label", "index_version", "metric", "judge_model", "rows",
            "scored", "errors", "skipped", "cached", "mean_score", "ci_low", "ci_high", "pass_rate", "cost_usd",
            "status", "status_reason", "judge", "error_rate"]  # fmt: skip
    return {k: summary.get(k) for k in keys}
