"""The Prefect adapter and the benchmark flow: the one library module that imports Prefect (besides ``events``).

The flow reads as its steps: plan, score the chunks (``window.score_chunks`` through :class:`PrefectChunks`),
commit, publish, finish. What Prefect adds here and nowhere else:

- each chunk is a task with retries for transient failures and Prefect's cache keyed on the chunk's content
  (``steps.chunk_key``), in the run's result storage (:func:`chunk_cache_storage`);
- the cache pre-check reads the same record the task engine would, without creating a task run;
- the progress artifact, the artifacts and events of :class:`~recall_tasks.pipeline.publish.Publication`.

``flows/recall_flow.py`` (the deployments' entrypoint) re-exports :func:`recall_benchmark`, so a deployment
runs exactly the flow the CLI runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any, cast
from uuid import UUID

from prefect import Flow, flow, get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext, get_run_context
from prefect.events import emit_event
from prefect.futures import PrefectFuture
from prefect.results import get_result_store
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from recall_tasks import _logging
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, JudgeTransientError, StorageError, WorkerDied
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline import commit, dask_paths, head_start, publish, steps, workers
from recall_tasks.pipeline.batch import finish as batch_finish
from recall_tasks.pipeline.batch import settle as batch
from recall_tasks.pipeline.steps import ChunkReport, RunPlan
from recall_tasks.pipeline.window import score_chunks
from recall_tasks.pipeline.workers import ChunkSpec
from recall_tasks.reports import alerts
from recall_tasks.summaries import FlowSummary

_logging.install("prefect.flow_runs", "prefect.task_runs")  # dataset values never forge a log line

#: Progress artifact updates are API calls (~50 ms each): at most one per interval, plus the last.
PROGRESS_INTERVAL_S = 2.0

_CACHE_PREFIX = "recall-chunk-"


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
    return _CACHE_PREFIX + str(parameters["key"])


#: The chunk task's name and retry rule, shared by its cached and uncached forms.
_CHUNK_TASK: dict[str, Any] = {
    "name": "score-chunk", "retries": 2, "retry_delay_seconds": [2, 10], "retry_condition_fn": _transient,
}  # fmt: skip


@task(**_CHUNK_TASK, cache_key_fn=_chunk_cache_key, persist_result=True)
def score_chunk(plan: RunPlan, seq: int, key: str) -> ChunkReport:
    """Score one chunk of rows and write its result file (a retry rewrites the same file).

    The rows are not a task parameter: Prefect keeps task parameters referenced after the run, which grew the
    flow by ~1 MB per chunk. The flow parks each chunk in ``plan.pending_blocks`` until its task settles.
    """
    return steps.score_chunk(plan, seq, plan.pending_blocks[seq], key)


#: ``--no-cache``: the same task function without Prefect's cache. Not ``score_chunk.with_options(cache_policy=
#: NO_CACHE)``: ``with_options`` cannot drop ``cache_key_fn``, and Prefect then warned on every such run that both
#: ``cache_policy`` and ``cache_key_fn`` were set. Same name, retries and retry rule.
score_chunk_uncached = task(**_CHUNK_TASK, cache_policy=NO_CACHE, persist_result=False)(score_chunk.fn)


def _spec_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """The same cache key as :func:`_chunk_cache_key`: a threads run and a processes run share the chunk cache."""
    return _CACHE_PREFIX + str(parameters["spec"].key)


@task(**_CHUNK_TASK, cache_key_fn=_spec_cache_key, persist_result=True)
def score_chunk_spec(spec: ChunkSpec) -> ChunkReport:
    """Score one chunk in a worker process (``--task-runner processes|dask``): see ``pipeline/workers.py``."""
    return workers.score_spec(spec)


score_chunk_spec_uncached = task(**_CHUNK_TASK, cache_policy=NO_CACHE, persist_result=False)(score_chunk_spec.fn)


def chunk_cache_storage(params: RunParams) -> Any:
    """Prefect result storage for the chunk cache: ``block:<slug>``, an fsspec URL, or a local path.

    Prefect only accepts saved blocks as result storage, so a URL or path is saved as a block named after it,
    WITHOUT credentials: s3fs (or gcsfs/adlfs) reads them from the worker's environment at run time.
    """
    from prefect.filesystems import LocalFileSystem, RemoteFileSystem, WritableFileSystem

    spec = cast(str, workers.cache_storage(params))
    if spec.startswith("block:"):
        return WritableFileSystem.load(spec.removeprefix("block:"))
    name = "recall-chunk-cache-" + hashlib.sha256(spec.encode()).hexdigest()[:12]
    block: Any
    if "://" in spec and not spec.startswith("file://"):
        settings: dict[str, Any] = {}
        if spec.startswith(("s3://", "s3a://")):
            storage = StorageConfig.from_options(params.storage_options)
            if storage.endpoint_url:
                settings["endpoint_url"] = storage.endpoint_url
            if storage.region:
                settings["client_kwargs"] = {"region_name": storage.region}
        block = RemoteFileSystem(basepath=spec, settings=settings)
    else:
        block = LocalFileSystem(basepath=os.path.abspath(spec.removeprefix("file://")))
    block.save(name, overwrite=True)
    return block


def chunk_task(params: RunParams) -> Any:
    """The chunk task with this run's cache settings (storage, expiry, refresh, or no cache).

    ``threads``: the task takes the plan in memory; ``processes``/``dask``: a :class:`ChunkSpec`.
    """
    in_process = params.task_runner == "threads"
    if not params.cache:
        return score_chunk_uncached if in_process else score_chunk_spec_uncached
    options: dict[str, Any] = {
        "cache_expiration": dt.timedelta(days=params.chunk_cache_days),
        "refresh_cache": params.refresh_cache,
    }
    if workers.cache_storage(params):
        options["result_storage"] = chunk_cache_storage(params)
    return (score_chunk if in_process else score_chunk_spec).with_options(**options)


def task_runner(params: RunParams) -> TaskRunner[Any] | None:
    """The run's chunk runner: None for ``threads`` (the flow's own), else a process pool or Dask."""
    if params.task_runner == "threads":
        return None
    n = params.workers or os.cpu_count() or 1
    if params.task_runner == "processes":
        return ProcessPoolTaskRunner(max_workers=n)
    try:
        from prefect_dask.task_runners import DaskTaskRunner
    except ImportError:
        raise ConfigError("--task-runner dask needs prefect-dask: pip install 'recall-bench[dask]'") from None
    if params.dask_address:
        return cast(TaskRunner[Any], DaskTaskRunner(address=params.dask_address))
    threads = max(1, -(-params.max_workers // n))  # the window's chunks in flight, spread over the workers
    cluster = {"n_workers": n, "threads_per_worker": threads, "processes": True, **LOCAL_CLUSTER_HTTP}
    return cast(TaskRunner[Any], DaskTaskRunner(cluster_kwargs=cluster))


#: The LocalCluster's scheduler always serves HTTP (health, metrics; the dashboard when bokeh is installed): with
#: ``dashboard_address=None`` on its default port 8787, where a second cluster on the host warns and moves. No
#: dashboard, and that server on a free loopback port: concurrent runs on one host never meet.
LOCAL_CLUSTER_HTTP: dict[str, Any] = {
    "dashboard_address": None,
    "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
}


class _TaskHandle:
    """A submitted chunk task; ``wait`` polls an event set by the future's done callback (cheap, interruptible)."""

    def __init__(self, future: PrefectFuture[ChunkReport], plan: RunPlan | None = None) -> None:
        self._future = future
        self._plan = plan  # set for a chunk scored in another process: its breaker's reason is adopted
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def report(self) -> tuple[ChunkReport, bool]:
        report = self._future.result()
        if self._plan is not None:
            workers.adopt(self._plan, report)
        return report, self._future.state.name == "Cached"


class PrefectChunks:
    """:class:`~recall_tasks.pipeline.window.ChunkExecutor` on Prefect tasks, cache and progress artifact."""

    def __init__(self, plan: RunPlan, runner: TaskRunner[Any] | None = None) -> None:
        self.plan = plan
        self.runner = runner  # None: the flow's thread pool and the plan in memory; else specs to other processes
        self.task = chunk_task(plan.params)
        self.store: Any = (
            get_result_store().update_for_task(self.task, _sync=True) if plan.params.cache else None  # type: ignore[call-arg]
        )
        self.progress_id = cast(
            UUID, create_progress_artifact(progress=0.0, description=f"rows scored in run {plan.run_id}")
        )
        self._last_progress = 0.0

    def cached(self, key: str) -> ChunkReport | None:
        """The record the task engine would read (same key, storage and expiry), without a task run.

        Any read problem (missing, expired, unreadable) means "not cached": the chunk goes through its task.
        """
        if self.store is None:
            return None
        try:
            record = self.store.read(_CACHE_PREFIX + key)
        except Exception:  # noqa: BLE001
            return None
        expiration = record.metadata.expiration
        if expiration is not None and expiration <= dt.datetime.now(dt.UTC):
            return None
        result = record.result
        return result if isinstance(result, ChunkReport) else None

    def submit(self, seq: int, key: str, *, refresh: bool) -> _TaskHandle:
        submit = self.task.with_options(refresh_cache=True) if refresh and self.plan.params.cache else self.task
        if self.runner is None:
            return _TaskHandle(submit.submit(quote(self.plan), seq, key))
        spec = workers.chunk_spec(self.plan, seq, self.plan.pending_blocks[seq], key)
        return _TaskHandle(self.runner.submit(submit, {"spec": spec}), self.plan)

    def progress(self, done_rows: int, total_rows: int, *, final: bool) -> None:
        now = time.monotonic()
        if total_rows and (final or now - self._last_progress >= PROGRESS_INTERVAL_S):
            update_progress_artifact(self.progress_id, progress=100.0 * done_rows / total_rows)
            self._last_progress = now


def send(publication: publish.Publication) -> None:
    """Create the publication's artifacts and emit its events."""
    for a in publication.artifacts:
        if a.kind == "table":
            create_table_artifact(a.data, key=a.key, description=a.description)
        elif a.kind == "markdown":
            create_markdown_artifact(a.data, key=a.key, description=a.description)
        else:
            create_link_artifact(a.data, link_text=a.link_text, key=a.key)
    for e in publication.events:
        emit_event(e.name, resource=e.resource, payload=e.payload)


def announce(plan: RunPlan, logger: Any) -> None:
    """The run's first log line: id, rows, files, metric and judge."""
    logger.info(
        "run %s%s: %s rows from %s (%d file(s)), metric %s, judge %s", plan.run_id,
        " (resumed)" if plan.resumed else "", plan.dataset.num_rows, plan.dataset.uri, len(plan.dataset.files),
        plan.params.metric, plan.metric.judge.model,
    )  # fmt: skip


@contextlib.contextmanager
def chunk_runner(params: RunParams, logger: Any) -> Iterator[TaskRunner[Any] | None]:
    """The run's ``--task-runner`` for the chunk tasks, started for the chunk loop (None: the flow's threads).

    A worker process that dies (SIGKILL, out of memory) breaks the whole pool: every chunk in flight fails with
    ``BrokenProcessPool``, which becomes one :class:`WorkerDied` (the chunk loop has already aborted and kept
    the judged rows; nothing is committed and the run's marker stays, so the same command resumes it).
    """
    runner = task_runner(params)
    if runner is None:
        yield None
        return
    warning = workers.local_cache_warning(params, workers.cache_storage(params))
    if warning:
        logger.warning("%s", warning)
    with runner:
        try:
            yield runner
        except BrokenProcessPool as exc:
            raise WorkerDied(
                f"a worker process died ({str(exc).rstrip('.')}): nothing committed; rerun the same command to resume"
            ) from exc


def flow_run_id() -> str | None:
    """The current flow run's id (None outside a flow run)."""
    run = getattr(get_run_context(), "flow_run", None)
    return str(run.id) if run is not None else None


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
def recall_benchmark(params: RunParams) -> FlowSummary:
    """Score a dataset's contextual recall and commit per-row results and run aggregates."""
    logger = get_run_logger()
    params = dask_paths.absolute(params)  # a deployment's relative paths: this process's folder, not the workers'
    plan = steps.plan_run(params)
    try:
        return _run_planned(params, plan, logger)
    except BaseException:
        head_start.settle_taken(plan)  # stopped before the chunk window took over its head starts
        raise
    finally:  # however the attempt ends, its lease goes (a no-op once the run is committed)
        steps.let_go(plan)


def _run_planned(params: RunParams, plan: RunPlan, logger: Any) -> FlowSummary:
    """The flow's steps once the run is planned and this attempt holds its lease."""
    announce(plan, logger)
    if params.batch:  # the Batch API first: a pending run returns here, nothing committed
        settled = batch.settle(plan)
        if settled.pending is not None:  # pending, or nothing to collect (batch_collect_only): nothing committed
            if settled.pending["status"] == batch.IDLE and not plan.resumed:
                steps.finish_run(plan)  # no attempt to resume: the marker begin_run wrote goes
            steps.release(plan)
            return settled.pending
        batch_finish.install(plan, settled)
    try:
        with chunk_runner(params, logger) as runner:
            tally = score_chunks(plan, PrefectChunks(plan, runner))
    except WorkerDied as exc:  # nothing committed, but a person is told (the run.failed alert)
        died = alerts.alert_for_worker_death(plan.dataset.name, plan.run_id, params.label, plan.dataset.uri, str(exc))
        emit_event(died.name, resource=died.resource, payload=died.payload)
        raise
    except StorageError as exc:  # mid-run: the checks had reached it. Judged rows kept by the abort (keep_judged)
        raise steps.store_outage(plan, exc) from None
    if tally.served_from_cache:
        logger.info("%d chunk(s) taken from Prefect's chunk cache without a task run", tally.served_from_cache)
    steps.check_lease(plan)
    try:
        committed = commit.commit_run(plan, tally.parts, flow_run_id())
    except StorageError as exc:  # the rows are judged and cached (or spilled): the rerun commits them unpaid
        raise steps.store_outage(plan, exc) from None
    summary, publication = publish.publish_run(plan, committed, logger)
    send(publication)
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


@flow(name="maintain-recall-tables")
def maintain_tables(
    output_uri: str,
    keep_days: float = 7.0,
    storage_options: dict[str, str] | None = None,
    allow_short_retention: bool = False,
) -> Any:
    """The nightly deployment's optional step: ``recall-bench maintain`` on ``output_uri`` (io/maintenance.py).

    Scheduled after the night's runs (deployments/prefect.yaml, ``nightly-maintenance``); a run committing
    meanwhile keeps its rows (retention floor and safety margin, retried compaction: io/maintenance.py). Storage
    credentials come from the worker's environment, as for the runs.
    """
    from recall_tasks.io.maintenance import maintain
    from recall_tasks.io.results import ResultStore, detect_format

    storage = StorageConfig.from_options(storage_options or {})
    store = ResultStore(output_uri, storage, detect_format(output_uri, storage))
    if store.format == "parquet":
        raise ConfigError("maintain works on delta and iceberg outputs; parquet files are never rewritten")
    rows = maintain(store, keep_days, allow_short_retention=allow_short_retention)
    for row in rows:
        get_run_logger().info("maintained %s", row)
    return rows
