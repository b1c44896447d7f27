"""The typed shapes of what a run returns (recall_tasks.summaries) match the runs table and a real run's row."""

from __future__ import annotations

import typing
from pathlib import Path

from recall_tasks.io.schemas import RUN_SCHEMA
from recall_tasks.pipeline import commit, publish, steps
from recall_tasks.pipeline.window import score_chunks
from recall_tasks.summaries import IdleSummary, PendingSummary, RunRow, RunSummary
from tests.test_pipeline import make_rows, write_parquet
from tests.test_window import PoolExecutor, plan_for


def test_the_run_row_has_the_runs_tables_columns_in_order() -> None:
    assert list(typing.get_type_hints(RunRow)) == RUN_SCHEMA.names
    assert RunRow.__required_keys__ == frozenset(RUN_SCHEMA.names)
    assert RunSummary.__optional_keys__ == {"comparison", "no_baseline", "baseline_missing", "report_uri"}


def test_the_status_literals_are_what_the_pipeline_writes() -> None:
    from recall_tasks.pipeline.batch import settle as batch

    status = typing.get_type_hints(RunRow)["status"]
    assert set(typing.get_args(status)) == {"completed", "failed", "budget_exhausted"}
    assert typing.get_args(typing.get_type_hints(PendingSummary)["status"]) == (batch.PENDING,)
    assert typing.get_args(typing.get_type_hints(IdleSummary)["status"]) == (batch.IDLE,)


def test_a_committed_run_returns_exactly_the_typed_row_and_summary(tmp_path: Path) -> None:
    import logging

    data = write_parquet(tmp_path / "data" / "d.parquet", make_rows(12))
    plan = plan_for(data, tmp_path / "out", label="v1", segment_by=["category"])
    row = commit.commit_run(plan, score_chunks(plan, PoolExecutor(plan)).parts)
    assert set(row) == set(RUN_SCHEMA.names)
    assert row["segment_column"] is None and row["batch_ids"] is None and row["batch_wait_s"] is None
    summary, _ = publish.publish_run(plan, row, logging.getLogger("test-summaries"))
    steps.finish_run(plan)
    assert set(summary) - set(row) == {"report_uri", "no_baseline"}  # first of its series: no comparison
    assert summary["no_baseline"] == "first run of its series" and row["not_judged"] == 0
    hints = typing.get_type_hints(RunSummary)
    for key, value in summary.items():  # every value of the real run has its declared type
        assert _is_instance(value, hints[key]), (key, value, hints[key])


def _is_instance(value: object, hint: object) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_is_instance(value, arg) for arg in typing.get_args(hint))
    if origin is not None:
        return isinstance(value, origin)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)  # type: ignore[arg-type]
