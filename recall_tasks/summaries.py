"""The shapes of what a run returns: the ``runs`` table's row, a finished run's summary, a pending batch run's.

Plain ``TypedDict``s (the flow, the CLI's JSON and ``RunFailed.summary`` keep handing dicts around, and Prefect
stores them as such), checked by mypy where they are read. :class:`RunRow` has the names of
``io.schemas.RUN_FIELDS``; ``tests/test_summaries.py`` checks it against the schema and a real run's row.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, TypedDict

RunStatus = Literal["completed", "failed", "budget_exhausted"]


class RunRow(TypedDict):
    """One row of the ``runs`` table as the pipeline builds it (the same names as :data:`RUN_FIELDS`, a test checks
    it): the overall row is what a finished run's summary starts from."""

    run_id: str
    flow_run_id: str | None
    started_at: dt.datetime
    finished_at: dt.datetime
    dataset: str
    run_date: str
    dataset_uri: str
    dataset_fingerprint: str
    label: str | None
    index_version: str | None
    metric: str
    judge_model: str
    prompt_version: str
    threshold: float
    scale: float
    segment_column: str | None
    segment_value: str | None
    rows: int
    scored: int
    errors: int
    skipped: int
    cached: int
    mean_score: float | None
    median_score: float | None
    p10_score: float | None
    ci_low: float | None
    ci_high: float | None
    pass_rate: float | None
    prompt_tokens: int
    completion_tokens: int
    requests: int
    cost_usd: float
    mean_context_precision: float | None
    chunk_use_rate: float | None
    wall_seconds: float
    status: RunStatus
    status_reason: str | None
    error_rate: float
    max_error_rate: float
    top_error: str | None
    top_error_count: int
    judge: str
    units: str
    schema_version: str | None
    splitter_version: str
    judge_config: str
    row_identity: str
    dataset_id: str
    batch_ids: list[str] | None
    batch_wait_s: float | None
    reply_models: list[str] | None
    substituted_rows: int | None
    canary_id: str | None
    canary_uri: str | None
    canary_rows: int | None
    canary_units: int | None
    canary_cached: int | None
    canary_errors: int | None
    canary_accuracy: float | None
    canary_accuracy_low: float | None
    canary_accuracy_high: float | None
    canary_kappa: float | None
    canary_kappa_low: float | None
    canary_kappa_high: float | None
    canary_tpr: float | None
    canary_tnr: float | None
    canary_requests: int | None
    canary_cost_usd: float | None
    canary_detail: list[dict[str, Any]] | None
    not_judged: int | None
    verdict_metric: str | None
    id_rows: int | None
    id_metrics: dict[str, float] | None
    id_metrics_low: dict[str, float] | None
    id_metrics_high: dict[str, float] | None


class RunSummary(RunRow, total=False):
    """What a finished run returns (the flow, ``recall-bench run``'s JSON, ``RunFailed.summary``): the overall run
    row, plus the comparison with the baseline (``Comparison.event_payload()``, when there was a baseline) or why
    there was none, and where the HTML report was written."""

    comparison: dict[str, Any]
    no_baseline: str  # why there is no comparison: "first run of its series", "no comparable baseline (…)"…
    baseline_missing: str  # --require-baseline and no comparison: the gate's message (exit 7)
    report_uri: str


class BatchInfo(TypedDict):
    """One recorded batch as a pending run reports it (``request_counts`` as the provider last gave them)."""

    id: str
    status: str | None
    requests: int
    round: int
    counts: dict[str, int] | None


class PendingSummary(TypedDict):
    """What the flow returns while a ``--batch`` run's batches are pending: nothing committed, not in ``runs``."""

    status: Literal["batch_pending"]
    run_id: str
    run_key: str
    rows: int
    batched_rows: int
    record: str
    output: str
    base_url: str | None  # the endpoint ``batch collect`` must be given too (--base-url), if the run had one
    submitted_at: str | None
    batches: list[BatchInfo]


class IdleSummary(TypedDict):
    """What a ``batch_collect_only`` run returns when its parameters have no pending batches."""

    status: Literal["batch_idle"]
    run_id: str
    run_key: str
    record: str
    reason: str


#: What the flow (and ``recall_benchmark``) returns: a finished run, a pending batch run, or nothing to collect.
FlowSummary = RunSummary | PendingSummary | IdleSummary
