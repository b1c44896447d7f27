"""The steps of a benchmark run as plain functions; ``flows/recall_flow.py`` only orchestrates them.

``plan_run`` validates everything (parameters, dataset schema, row ids, segment columns, output location,
judge configuration) before any judge call or write. ``score_chunk`` scores one block and stages its
results. ``commit_run`` aggregates the staged results, commits them and the run rows at once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import secrets as pysecrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks._sync import run_sync
from recall_tasks.aggregates import summarize, summarize_segments
from recall_tasks.cache import RowVerdictCache
from recall_tasks.datasets import Dataset, RowBlock, open_dataset, parse_column_overrides, stored_type, type_name
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.judges.base import Judge
from recall_tasks.metrics import ContextCoverage, ContextualRecall
from recall_tasks.metrics.base import Metric
from recall_tasks.results import ChunkPart, ResultStore, today
from recall_tasks.retrieval import RetrievalResults, Retriever, load_retriever, retrieve, with_contexts
from recall_tasks.scoring import (
    CHUNK_FIELDS,
    NOT_JUDGED,
    Budget,
    CircuitBreaker,
    metric_fingerprint,
    passthrough_name,
    score_block,
)
from recall_tasks.storage import StorageConfig, join_uri

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
    run_key: str
    resumed: bool
    dataset: Dataset
    metric: Metric
    store: ResultStore
    started_at: dt.datetime
    started_clock: float
    segment_columns: list[str] = field(default_factory=list)
    cache: RowVerdictCache | None = None
    budget: Budget | None = None
    breaker: CircuitBreaker | None = None
    config_hash: str = ""
    retriever: Retriever | None = None
    retrieval: RetrievalResults | None = None
    pending_blocks: dict[int, RowBlock] = field(default_factory=dict)  # chunks submitted, not yet settled

    def prepare_block(self, block: RowBlock) -> RowBlock:
        """Fill the block's contexts from the run-time retriever or the retrieval results, if configured."""
        if self.retrieval is not None:
            return with_contexts(block, self.retrieval.contexts_for(block.row_ids))
        if self.retriever is not None:
            questions = [q or "" for q in block.table.column("input").to_pylist()]
            return with_contexts(block, retrieve(self.retriever, questions))
        return block


def _run_key(params: Any, dataset: Dataset) -> str:
    """Same command on the same data -> same key (an unfinished attempt with this key is resumed)."""
    payload = json.dumps([params.model_dump(mode="json"), dataset.fingerprint], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def plan_run(params: Any, run_id: str | None = None) -> RunPlan:
    """Validate the run before anything is judged or written; raise one clear error otherwise."""
    storage = StorageConfig.from_options(params.storage_options)
    overrides = parse_column_overrides(params.columns)
    supplied = bool(params.retriever or params.retrieval_uri)
    dataset = open_dataset(params.dataset_uri, storage, params.metric, overrides, context_supplied=supplied)
    retriever = load_retriever(params.retriever) if params.retriever else None
    retrieval = RetrievalResults(params.retrieval_uri, storage) if params.retrieval_uri else None
    segments = []
    for col in params.segment_by:
        if col not in dataset.passthrough:
            available = ", ".join(dataset.passthrough) or "none"
            raise DatasetError(
                f"--segment-by {col}: not a pass-through column; available: {available}",
                uri=params.dataset_uri, column=col,
            )  # fmt: skip
        typ = dataset.passthrough_types[col]
        if pa.types.is_nested(typ):
            raise DatasetError(
                f"--segment-by {col}: a {type_name(typ)} column cannot segment a run; segment by a text, number, "
                "boolean or date column",
                uri=dataset.files[0].uri, column=col,
            )  # fmt: skip
        segments.append(passthrough_name(col))
    try:
        store = ResultStore(params.output_uri, storage, params.format)
    except (ValueError, ImportError, OSError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ConfigError(f"cannot open the output {params.output_uri}: {detail}") from None
    _check_results_schema(dataset, store)
    metric = make_metric(params, make_judge(params))
    cache = None
    if params.cache:
        cache_uri = params.cache_uri or join_uri(params.output_uri, "cache")
        cache = RowVerdictCache(cache_uri, storage, read=not params.refresh_cache)
    run_key = _run_key(params, dataset)
    started = dt.datetime.now(dt.UTC)
    the_run_id, started, resumed = store.begin_run(run_key, run_id or new_run_id(), started)
    config = {
        "metric": metric_fingerprint(metric), "threshold": params.threshold, "scale": params.scale,
        "strict": params.strict_mode, "on_missing": params.on_missing, "output": params.output_uri,
        "passthrough": dataset.passthrough,
    }  # fmt: skip
    return RunPlan(
        params=params, run_id=the_run_id, run_key=run_key, resumed=resumed, dataset=dataset, metric=metric,
        store=store, started_at=started, started_clock=time.perf_counter(), segment_columns=segments,
        cache=cache, budget=Budget(params.max_requests, params.max_cost_usd),
        breaker=CircuitBreaker(timeout_threshold=max(3, params.max_concurrency)),
        config_hash=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16],
        retriever=retriever, retrieval=retrieval,
    )  # fmt: skip


def _check_results_schema(dataset: Dataset, store: ResultStore) -> None:
    """A pass-through column must have the type the existing ``results`` table has under its name.

    Checked before judging: Delta's schema merge would refuse the commit after every row was paid for. Names
    are compared ignoring case (Delta's rule); timestamps compare by unit and by having a time zone or not
    (Delta stores instants in UTC).
    """
    existing = store.read_table("results")
    if existing is None:
        return
    by_lower = {f.name.lower(): f for f in existing.schema}
    for col in dataset.passthrough:
        name, typ = passthrough_name(col), dataset.passthrough_types[col]
        old = by_lower.get(name.lower())
        if old is None:
            continue
        if old.name != name:
            raise DatasetError(
                f"pass-through column stored as {name!r}, but the results table {store.results_uri} has "
                f"{old.name!r}, which differs only in case: rename the column or write to another --output",
                uri=dataset.files[0].uri, column=col,
            )  # fmt: skip
        if _comparable(old.type) != _comparable(typ):
            raise DatasetError(
                f"pass-through column is {type_name(typ)}, but the results table {store.results_uri} has "
                f"{old.name!r} as {type_name(old.type)}: cast the column, rename it, or write to another --output",
                uri=dataset.files[0].uri, column=col,
            )  # fmt: skip


def _comparable(t: pa.DataType) -> str:
    try:
        t = stored_type(t)
    except ValueError:
        pass
    if pa.types.is_timestamp(t) and t.tz:
        t = pa.timestamp(t.unit, tz="UTC")
    return type_name(t)


def chunk_key(plan: RunPlan, block: RowBlock) -> str:
    """Content address of a chunk's results: its rows (ids, content, pass-through values) and the config.

    Prefect's chunk cache is keyed on this; it never sees run ids, timestamps or Arrow objects.
    """
    h = hashlib.sha256(plan.config_hash.encode())
    for row_id, content in zip(block.row_ids, block.content_hashes, strict=True):
        h.update(f"{row_id}\x00{content}\x01".encode())
    passthrough = [c for c in block.table.column_names if c not in _ROLE_COLUMNS]
    if passthrough:
        h.update(json.dumps(block.table.select(passthrough).to_pydict(), default=str).encode())
    return h.hexdigest()[:32]


_ROLE_COLUMNS = {"input", "expected_output", "retrieval_context", "actual_output"}


@dataclass
class ChunkReport:
    """What a chunk task returns: small, so Prefect never holds row data (and can cache it).

    ``not_judged``: rows the budget or the circuit breaker kept from the judge. ``None`` in reports cached
    before the field existed: unknown, so such a report is not reused (see :attr:`reusable`).
    """

    seq: int
    rows: int
    errors: int
    scored: int
    path: str
    not_judged: int | None = None

    @property
    def reusable(self) -> bool:
        """Only successes are cached: a report with an errored or not-judged row is never served whole.

        Prefect persists every task result under the chunk's key (a cache policy cannot see the result), so
        the flow checks this before using a cached report; such a chunk goes through its task again (its
        good rows then come from the row cache, which only holds parsed verdicts) and refreshes the record.
        """
        return self.errors == 0 and self.not_judged == 0


def score_chunk(plan: RunPlan, seq: int, block: RowBlock, key: str) -> ChunkReport:
    """Score one block (async judge calls on the shared loop) and write its result file."""
    table = run_sync(score_block(plan.metric, block, plan.cache, plan.budget, plan.breaker))
    if plan.cache is not None:
        plan.cache.flush()
    path = plan.store.chunk_path(key, plan.run_id)
    plan.store.write_chunk(path, table)
    errors = int(pc.sum(pc.is_valid(table.column("error"))).as_py() or 0)
    scored = int(pc.sum(pc.is_valid(table.column("score"))).as_py() or 0)
    not_judged = pc.and_(table.column("skipped"), pc.starts_with(table.column("reason"), NOT_JUDGED))
    return ChunkReport(
        seq=seq, rows=table.num_rows, errors=errors, scored=scored, path=path,
        not_judged=int(pc.sum(pc.fill_null(not_judged, False)).as_py() or 0),
    )  # fmt: skip


_SUMMARY_COLUMNS = [
    "score", "success", "error", "skipped", "cached", "prompt_tokens", "completion_tokens", "requests", "cost_usd",
]  # fmt: skip


def commit_run(plan: RunPlan, parts: list[ChunkPart], flow_run_id: str | None = None) -> dict[str, Any]:
    """Aggregate the run's chunk files, commit results and run rows; returns the overall run row."""
    columns = _SUMMARY_COLUMNS + plan.segment_columns
    if parts:
        table = pa.Table.from_batches(list(plan.store.read_parts(parts, columns=columns)))
    else:
        table = pa.schema([f for f in CHUNK_FIELDS if f.name in _SUMMARY_COLUMNS]).empty_table()
        for col in plan.segment_columns:
            table = table.append_column(col, pa.array([], pa.string()))
    if plan.cache is not None:
        plan.cache.close()
    p = plan.params
    budget_reason = plan.budget.exhausted_reason if plan.budget else None
    breaker_reason = plan.breaker.tripped_reason if plan.breaker else None  # an outage: the run failed
    base = {
        "run_id": plan.run_id, "flow_run_id": flow_run_id, "started_at": plan.started_at,
        "finished_at": dt.datetime.now(dt.UTC), "dataset": plan.dataset.name, "run_date": today(),
        "dataset_uri": p.dataset_uri, "dataset_fingerprint": plan.dataset.fingerprint, "label": p.label,
        "index_version": p.index_version or p.label, "metric": p.metric, "judge_model": plan.metric.judge.model,
        "prompt_version": plan.metric.judge.prompt_version, "threshold": p.threshold, "scale": p.scale,
        "wall_seconds": time.perf_counter() - plan.started_clock,
        "status": "failed" if breaker_reason else "budget_exhausted" if budget_reason else "completed",
        "status_reason": breaker_reason or budget_reason,
    }  # fmt: skip
    overall = {**base, "segment_column": None, "segment_value": None, **summarize(table)}
    runs = [overall]
    for col in plan.segment_columns:
        for value, stats in summarize_segments(table, col):
            runs.append({**base, "segment_column": col, "segment_value": value, **stats})
    plan.store.commit(plan.run_id, plan.dataset.name, base["run_date"], parts, runs)
    return overall


def release(plan: RunPlan) -> None:
    """Close the judge's HTTP client (it lives on the shared background loop)."""
    close = getattr(plan.metric.judge, "aclose", None)
    if close is not None:
        run_sync(close())


def finish_run(plan: RunPlan) -> None:
    """The run is committed and compared: a rerun of the same command now starts a new run."""
    plan.store.end_run(plan.run_key)


def chunk_cache_storage(params: Any) -> Any:
    """Prefect result storage for the chunk cache: ``block:<slug>``, an fsspec URL, or a local path.

    Prefect only accepts saved blocks as result storage, so a URL or path is saved as a block named after it,
    WITHOUT credentials: s3fs (or gcsfs/adlfs) reads them from the worker's environment at run time.
    """
    spec = params.chunk_cache_storage
    if spec.startswith("block:"):
        from prefect.filesystems import WritableFileSystem

        return WritableFileSystem.load(spec.removeprefix("block:"))
    name = "recall-chunk-cache-" + hashlib.sha256(spec.encode()).hexdigest()[:12]
    block: Any
    if "://" in spec and not spec.startswith("file://"):
        from prefect.filesystems import RemoteFileSystem

        settings: dict[str, Any] = {}
        if spec.startswith(("s3://", "s3a://")):
            storage = StorageConfig.from_options(params.storage_options)
            if storage.endpoint_url:
                settings["endpoint_url"] = storage.endpoint_url
            if storage.region:
                settings["client_kwargs"] = {"region_name": storage.region}
        block = RemoteFileSystem(basepath=spec, settings=settings)
    else:
        from prefect.filesystems import LocalFileSystem

        block = LocalFileSystem(basepath=os.path.abspath(spec.removeprefix("file://")))
    block.save(name, overwrite=True)
    return block
