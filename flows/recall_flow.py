"""The benchmark flow: validate -> score chunks (Prefect tasks, cached) -> commit -> report.

Logic lives in ``recall_tasks``; this module only orchestrates. Why the chunk loop is not one big ``.map``:
a task's parameters stay in the flow's memory until it finishes, so chunks are submitted through a window of
``max_workers`` futures: memory stays bounded by the window whatever the dataset size.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import deque
from typing import Any, cast
from uuid import UUID

from prefect import Flow, flow, get_run_logger, task
from prefect.artifacts import (
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext, get_run_context
from prefect.futures import PrefectFuture
from prefect.results import get_result_store
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from recall_tasks import _logging
from recall_tasks.config import RunParams
from recall_tasks.errors import JudgeTransientError, StorageError
from recall_tasks.io.datasets import iter_blocks
from recall_tasks.io.results import ChunkPart
from recall_tasks.pipeline import publish, steps

_logging.install("prefect.flow_runs", "prefect.task_runs")  # dataset values never forge a log line


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk only for failures that may pass: storage hiccups and judge transients."""
    try:
        state.result()
    except (StorageError, JudgeTransientError, ConnectionError, TimeoutError):
        return True
    except Exception:  # noqa: BLE001 - configuration errors and bugs are not retried
        return False
    return False


def _chunk_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Prefect's chunk cache key: the chunk's content address (rows, pass-through values, judge config)."""
    return _CACHE_PREFIX + parameters["key"]


_CACHE_PREFIX = "recall-chunk-"


#: The chunk task's name and retry rule, shared by its cached and uncached forms.
_CHUNK_TASK: dict[str, Any] = {
    "name": "score-chunk", "retries": 2, "retry_delay_seconds": [2, 10], "retry_condition_fn": _transient,
}  # fmt: skip


@task(**_CHUNK_TASK, cache_key_fn=_chunk_cache_key, persist_result=True)
def score_chunk(plan: steps.RunPlan, seq: int, key: str) -> steps.ChunkReport:
    """Score one chunk of rows and write its result file (a retry rewrites the same file).

    The rows are not a task parameter: Prefect keeps task parameters referenced after the run, which grew the
    flow by ~1 MB per chunk. The flow parks each chunk in ``plan.pending_blocks`` until its task settles.
    """
    return steps.score_chunk(plan, seq, plan.pending_blocks[seq], key)


#: ``--no-cache``: the same task function without Prefect's cache. Not ``score_chunk.with_options(cache_policy=
#: NO_CACHE)``: ``with_options`` cannot drop ``cache_key_fn``, and Prefect then warned on every such run that both
#: ``cache_policy`` and ``cache_key_fn`` were set. Same name, retries and retry rule.
score_chunk_uncached = task(**_CHUNK_TASK, cache_policy=NO_CACHE, persist_result=False)(score_chunk.fn)


def _cached_report(store: Any, key: str) -> steps.ChunkReport | None:
    """The chunk's report if Prefect's cache holds a live record for it, read without creating a task run.

    Same record, key and storage the task engine would use (``cache_key_fn``, ``result_storage``,
    ``cache_expiration``): an unchanged rerun then costs no task-run round trip per chunk. Any read problem
    (missing, expired, unreadable) means "not cached" and the chunk goes through its task as usual; a report
    that is not :attr:`~recall_tasks.pipeline.steps.ChunkReport.reusable` is returned, and the caller refreshes it.
    """
    try:
        record = store.read(_CACHE_PREFIX + key)
    except Exception:  # noqa: BLE001
        return None
    expiration = record.metadata.expiration
    if expiration is not None and expiration <= dt.datetime.now(dt.UTC):
        return None
    result = record.result
    return result if isinstance(result, steps.ChunkReport) else None


def _usable(report: steps.ChunkReport | None) -> bool:
    """Only successes are served from the chunk cache: errored or not-judged rows are judged again."""
    return report is not None and report.reusable


#: How long an aborted run waits for each chunk task in flight to settle after cancelling its judge calls.
ABORT_WAIT_S = 2.0

#: Progress artifact updates are API calls (~50 ms each): at most one per interval, plus the last.
PROGRESS_INTERVAL_S = 2.0


#: While waiting for a chunk task, the flow's thread wakes this often (see ``_wait_interruptibly``).
SIGNAL_POLL_S = 0.05


def _wait_interruptibly(future: PrefectFuture[Any]) -> None:
    """Block until the chunk task settles, waking every ``SIGNAL_POLL_S``.

    Python runs a signal handler only when the main thread executes bytecode, and the kernel may deliver SIGINT
    or SIGTERM to a chunk thread while this one sleeps in a lock: a plain ``future.result()`` then held Ctrl-C
    until the chunk finished (~1 s and ~100 more judge calls in a probe at concurrency 20).
    """
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    while not done.wait(SIGNAL_POLL_S):
        pass


def _chunk_task(params: RunParams) -> Any:
    """The chunk task with this run's cache settings (storage, expiry, refresh, or no cache)."""
    if not params.cache:
        return score_chunk_uncached
    options: dict[str, Any] = {
        "cache_expiration": dt.timedelta(days=params.chunk_cache_days),
        "refresh_cache": params.refresh_cache,
    }
    if params.chunk_cache_storage:
        options["result_storage"] = steps.chunk_cache_storage(params)
    return score_chunk.with_options(**options)


def _flow_run_name() -> str:
    params = get_run_context().flow_run.parameters["params"]  # type: ignore[union-attr]
    get = params.get if isinstance(params, dict) else lambda k: getattr(params, k)
    name = str(get("dataset_uri")).rstrip("/").split("/")[-1]
    return f"recall-{name}-{get('label') or 'adhoc'}"


@flow(
    name="recall-benchmark",
    flow_run_name=_flow_run_name,
    task_runner=ThreadPoolTaskRunner(max_workers=16),  # type: ignore[arg-type]
)
def recall_benchmark(params: RunParams) -> dict[str, Any]:
    """Score a dataset's contextual recall and commit per-row results and run aggregates."""
    logger = get_run_logger()
    plan = steps.plan_run(params)
    ctx = get_run_context()
    flow_run_id = str(ctx.flow_run.id) if getattr(ctx, "flow_run", None) else None  # type: ignore[union-attr]
    total = plan.dataset.num_rows
    logger.info(
        "run %s%s: %s rows from %s (%d file(s)), metric %s, judge %s", plan.run_id,
        " (resumed)" if plan.resumed else "", total, plan.dataset.uri, len(plan.dataset.files), params.metric,
        plan.metric.judge.model,
    )  # fmt: skip
    progress_id = cast(UUID, create_progress_artifact(progress=0.0, description=f"rows scored in run {plan.run_id}"))
    chunk_task = _chunk_task(params)
    window: deque[tuple[PrefectFuture[steps.ChunkReport], int, str]] = deque()
    parts: list[ChunkPart] = []
    done_rows = 0
    reused_chunks = 0
    last_progress = 0.0
    cache_store = get_result_store().update_for_task(chunk_task, _sync=True) if params.cache else None  # type: ignore[call-arg]

    def progress(final: bool = False) -> None:
        nonlocal last_progress
        steps.notify_progress(done_rows, total)
        now = time.monotonic()
        if total and (final or now - last_progress >= PROGRESS_INTERVAL_S):
            update_progress_artifact(progress_id, progress=100.0 * done_rows / total)
            last_progress = now

    def record(seq: int, report: steps.ChunkReport, reused: bool) -> None:
        nonlocal done_rows
        plan.pending_blocks.pop(seq, None)
        parts.append(ChunkPart(report.path, reused=reused))
        done_rows += report.rows
        progress()

    def settle() -> None:
        future, seq, key = window.popleft()
        _wait_interruptibly(future)
        report = future.result()
        cached = future.state.name == "Cached"
        reused = cached and not report.path.endswith(f"/{plan.run_id}.parquet")
        # a cached report with failures, or whose file was pruned: judge again, refreshing the record
        if cached and (not _usable(report) or (reused and not plan.store.exists(report.path))):
            report = chunk_task.with_options(refresh_cache=True)(quote(plan), seq, key)
            reused = False
        record(seq, report, reused)

    try:
        for seq, raw in enumerate(iter_blocks(plan.dataset, params.chunk_size)):
            block = plan.prepare_block(raw)
            key = steps.chunk_key(plan, block)
            cached = None if cache_store is None or params.refresh_cache else _cached_report(cache_store, key)
            submit = chunk_task
            if cached is not None:
                if _usable(cached) and cached.rows == len(block.row_ids) and plan.store.exists(cached.path):
                    reused_chunks += 1
                    record(seq, cached, reused=not cached.path.endswith(f"/{plan.run_id}.parquet"))
                    continue
                submit = chunk_task.with_options(refresh_cache=True)  # failures or a pruned file: judge again
            plan.pending_blocks[seq] = block
            window.append((submit.submit(quote(plan), seq, key), seq, key))
            while len(window) >= params.max_workers:
                settle()
        while window:
            settle()
        progress(final=True)
    except BaseException:  # an interrupt, a configuration error: cancel the judge calls in flight, don't wait
        steps.abort(plan)
        for future, _, _ in window:
            future.wait(timeout=ABORT_WAIT_S)  # cancelled chunks settle in milliseconds; a retry delay is not waited
        steps.keep_judged(plan)
        raise
    finally:
        steps.release(plan)
    if reused_chunks:
        logger.info("%d chunk(s) taken from Prefect's chunk cache without a task run", reused_chunks)
    summary = publish.publish_run(plan, steps.commit_run(plan, parts, flow_run_id), logger)
    steps.finish_run(plan)
    publish.raise_for_outcome(plan, summary)
    return summary


def _serialize_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The flow run's parameters as JSON: a ``RunParams`` by pydantic itself, anything else as Prefect does.

    Prefect's ``Flow.serialize_parameters`` imports fastapi for ``jsonable_encoder`` (0.2-0.4 s of an ad-hoc run's
    start-up, before the first judge request); for a pydantic model without aliases that encoder returns exactly
    ``model_dump(mode="json")``. Deployment runs pass a dict and keep Prefect's path.
    """
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if isinstance(value, RunParams):
            out[key] = value.model_dump(mode="json")
        else:
            out.update(Flow.serialize_parameters(recall_benchmark, {key: value}))
    return out


recall_benchmark.serialize_parameters = _serialize_parameters  # type: ignore[method-assign]
