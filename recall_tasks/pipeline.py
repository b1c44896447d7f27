"""The steps of a benchmark run as plain functions; ``flows/recall_flow.py`` only orchestrates them.

``plan_run`` validates everything (parameters, dataset schema, row ids, segment columns, output location,
judge configuration) before any judge call or write. ``score_chunk`` scores one block and stages its
results. ``commit_run`` aggregates the staged results, commits them and the run rows at once.
"""

from __future__ import annotations

import datetime as dt
import secrets as pysecrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from recall_tasks._sync import run_sync
from recall_tasks.aggregates import summarize, summarize_segments
from recall_tasks.datasets import Dataset, RowBlock, open_dataset, parse_column_overrides
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.judges.base import Judge
from recall_tasks.metrics import ContextCoverage, ContextualRecall
from recall_tasks.metrics.base import Metric
from recall_tasks.results import ResultStore, today
from recall_tasks.scoring import RowCache, passthrough_name, score_block
from recall_tasks.storage import StorageConfig

ProgressListener = Callable[[int, int], None]
_listeners: list[ProgressListener] = []


def add_progress_listener(fn: ProgressListener) -> None:
    """Register ``fn(done_rows, total_rows)``; the CLI draws its progress bar with it."""
    _listeners.append(fn)


def remove_progress_listener(fn: ProgressListener) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def notify_progress(done: int, total: int) -> None:
    for fn in list(_listeners):
        fn(done, total)


def make_judge(params: Any) -> Judge:
    """The judge a run asks for; keys come from the environment, never from parameters."""
    if params.judge == "lexical":
        from recall_tasks.judges.lexical import LexicalJudge

        return LexicalJudge()
    from recall_tasks.judges.openai_judge import OpenAIJudge

    return OpenAIJudge(
        model=params.model,
        base_url=params.base_url,
        max_concurrency=params.max_concurrency,
        timeout_s=params.timeout_s,
        max_retries=params.max_retries,
    )


def make_metric(params: Any, judge: Judge) -> Metric:
    cls = ContextualRecall if params.metric == "contextual_recall" else ContextCoverage
    return cls(
        judge=judge,
        threshold=params.threshold,
        scale=params.scale,
        include_reason=params.include_reason,
        strict_mode=params.strict_mode,
        on_missing=params.on_missing,
    )


def new_run_id() -> str:
    """Sortable and unique: ``20261130T171502Z-3f9a1c``."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + pysecrets.token_hex(3)


@dataclass
class RunPlan:
    """A validated run: everything ``score_chunk`` and ``commit_run`` need."""

    params: Any
    run_id: str
    dataset: Dataset
    metric: Metric
    store: ResultStore
    started_at: dt.datetime
    started_clock: float
    segment_columns: list[str] = field(default_factory=list)
    cache: RowCache | None = None


def plan_run(params: Any, run_id: str | None = None) -> RunPlan:
    """Validate the run before anything is judged or written; raise one clear error otherwise."""
    storage = StorageConfig.from_options(params.storage_options)
    overrides = parse_column_overrides(params.columns)
    dataset = open_dataset(params.dataset_uri, storage, params.metric, overrides)
    segments = []
    for col in params.segment_by:
        if col not in dataset.passthrough:
            raise DatasetError(
                f"--segment-by {col}: not a pass-through column; available: {', '.join(dataset.passthrough) or 'none'}",
                uri=params.dataset_uri,
                column=col,
            )
        segments.append(passthrough_name(col))
    try:
        store = ResultStore(params.output_uri, storage, params.format)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    metric = make_metric(params, make_judge(params))
    return RunPlan(
        params=params,
        run_id=run_id or new_run_id(),
        dataset=dataset,
        metric=metric,
        store=store,
        started_at=dt.datetime.now(dt.UTC),
        started_clock=time.perf_counter(),
        segment_columns=segments,
    )


@dataclass
class ChunkReport:
    """What a chunk task returns: small, so Prefect never holds row data."""

    seq: int
    rows: int
    errors: int
    scored: int
    path: str


def score_chunk(plan: RunPlan, seq: int, block: RowBlock) -> ChunkReport:
    """Score one block (async judge calls on the shared loop) and stage its result table."""
    table = run_sync(score_block(plan.metric, block, plan.run_id, plan.cache))
    path = plan.store.stage(plan.run_id, seq, table)
    errors = int(pc.sum(pc.is_valid(table.column("error"))).as_py() or 0)
    scored = int(pc.sum(pc.is_valid(table.column("score"))).as_py() or 0)
    return ChunkReport(seq=seq, rows=table.num_rows, errors=errors, scored=scored, path=path)


_SUMMARY_COLUMNS = [
    "score",
    "success",
    "error",
    "skipped",
    "cached",
    "prompt_tokens",
    "completion_tokens",
    "requests",
    "cost_usd",
]


def commit_run(plan: RunPlan, flow_run_id: str | None = None) -> dict[str, Any]:
    """Aggregate the staged results, then commit results and run rows; returns the overall run row."""
    staged = plan.store.staged(plan.run_id)
    columns = _SUMMARY_COLUMNS + plan.segment_columns
    if staged is None:
        import pyarrow as pa

        from recall_tasks.scoring import RESULT_FIELDS

        fields = [f for f in RESULT_FIELDS if f.name in _SUMMARY_COLUMNS]
        table = pa.schema(fields).empty_table()
        for col in plan.segment_columns:
            table = table.append_column(col, pa.array([], pa.string()))
    else:
        table = staged.to_table(columns=columns)
    p = plan.params
    finished = dt.datetime.now(dt.UTC)
    base = {
        "run_id": plan.run_id,
        "flow_run_id": flow_run_id,
        "started_at": plan.started_at,
        "finished_at": finished,
        "dataset": plan.dataset.name,
        "run_date": today(),
        "dataset_uri": p.dataset_uri,
        "dataset_fingerprint": plan.dataset.fingerprint,
        "label": p.label,
        "index_version": p.index_version or p.label,
        "metric": p.metric,
        "judge_model": plan.metric.judge.model,
        "prompt_version": plan.metric.judge.prompt_version,
        "threshold": p.threshold,
        "scale": p.scale,
        "wall_seconds": time.perf_counter() - plan.started_clock,
        "status": "completed",
    }
    overall = {**base, "segment_column": None, "segment_value": None, **summarize(table)}
    runs = [overall]
    for col in plan.segment_columns:
        for value, stats in summarize_segments(table, col):
            runs.append({**base, "segment_column": col, "segment_value": value, **stats})
    plan.store.commit(plan.run_id, plan.dataset.name, base["run_date"], runs)
    return overall
