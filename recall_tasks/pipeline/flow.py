"""The Prefect adapter and the benchmark flow: with ``flow_tasks`` the library modules that import Prefect
(besides ``events`` and the fleet limits).

:func:`run_benchmark` is the run as plain steps (``conduct.conduct``: plan, score the chunks through
:class:`PrefectChunks`, commit, publish, finish); the ``@flow`` :func:`recall_benchmark` is a thin wrapper around
it. What Prefect adds here and nowhere else:

- each chunk is a task with retries for transient failures (``flow_tasks``; never cached by Prefect: the row
  cache is the one verdict store);
- the progress artifact, the artifacts and events of :class:`~recall_tasks.pipeline.publish.Publication`.

:func:`watched_benchmark` is the same flow for a caller in this process that watches the run or may cancel it
(the command line's progress bar and Ctrl-C, ``evaluate(prefect=True)``): the observer and the cancel scope are two
more ordinary arguments, which Prefect records as placeholders. The deployments' flow keeps ``params`` alone as its
parameter schema.

``flows/recall_flow.py`` (the deployments' entrypoint) re-exports :func:`recall_benchmark`, so a deployment
runs exactly the flow the CLI runs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.context import get_run_context
from prefect.events import emit_event
from prefect.futures import PrefectFuture
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from recall_tasks import _logging
from recall_tasks._sync import CancelScope
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, WorkerDied
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline import publish, trust, workers
from recall_tasks.pipeline.conduct import conduct
from recall_tasks.pipeline.flow_tasks import score_chunk
from recall_tasks.pipeline.flow_tasks import score_chunk_spec as score_chunk_spec  # tests take the task from here
from recall_tasks.pipeline.run import NO_OBSERVER, ChunkReport, RunObserver, RunPlan
from recall_tasks.reports import alerts
from recall_tasks.summaries import FlowSummary

_logging.install("prefect.flow_runs", "prefect.task_runs")  # dataset values never forge a log line

#: Progress artifact updates are API calls (~50 ms each): at most one per interval, plus the last.
PROGRESS_INTERVAL_S = 2.0


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

    def report(self) -> ChunkReport:
        report = self._future.result()
        if self._plan is not None:
            workers.adopt(self._plan, report)
        return report


class PrefectChunks:
    """:class:`~recall_tasks.pipeline.window.ChunkExecutor` on Prefect tasks and the progress artifact."""

    def __init__(self, plan: RunPlan, runner: TaskRunner[Any] | None = None) -> None:
        self.plan = plan
        self.runner = runner  # None: the flow's thread pool and the plan in memory; else specs to other processes
        self.progress_id = cast(
            UUID, create_progress_artifact(progress=0.0, description=f"rows scored in run {plan.run_id}")
        )
        self._last_progress = 0.0

    def submit(self, seq: int, key: str) -> _TaskHandle:
        if self.runner is None:
            task: Any = score_chunk  # ``quote(plan)`` stands for the plan, which Prefect's overloads cannot type
            return _TaskHandle(task.submit(quote(self.plan), seq, key))
        spec = workers.chunk_spec(self.plan, seq, self.plan.window.pending[seq], key)
        return _TaskHandle(self.runner.submit(score_chunk_spec, {"spec": spec}), self.plan)

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
def chunk_runner(params: RunParams) -> Iterator[TaskRunner[Any] | None]:
    """The run's ``--task-runner`` for the chunk tasks, started for the chunk loop (None: the flow's threads).

    A worker process that dies (SIGKILL, out of memory) breaks the whole pool: every chunk in flight fails with
    ``BrokenProcessPool``, which becomes one :class:`WorkerDied` (the chunk loop has already aborted and kept
    the judged rows; nothing is committed and the run's marker stays, so the same command resumes it).
    """
    runner = task_runner(params)
    if runner is None:
        yield None
        return
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


def deployment_run() -> bool:
    """Whether this flow run was created from a deployment (a schedule, a trigger, the UI, the API)."""
    run = getattr(get_run_context(), "flow_run", None)
    return run is not None and run.deployment_id is not None


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
    """Score a dataset's contextual recall and commit per-row results and run aggregates.

    A deployment's flow run (its parameters come from whoever may create runs) is checked against what the
    worker allows first (``pipeline/trust.py``); a run from the command line or Python is the worker's own user.
    """
    return run_benchmark(params)


@flow(
    name="recall-benchmark",
    flow_run_name=_flow_run_name,
    task_runner=ThreadPoolTaskRunner(max_workers=16),  # type: ignore[arg-type]
    validate_parameters=False,  # a RunParams already; the observer and the scope are this process's objects
)
def watched_benchmark(params: RunParams, observer: RunObserver, scope: CancelScope | None) -> FlowSummary:
    """:func:`recall_benchmark` for a caller of this process that watches the run (``observer``: the command
    line's progress bar and interrupt message) or may cancel it (``scope``): never deployed."""
    return run_benchmark(params, observer=observer, scope=scope)


def run_benchmark(
    params: RunParams, *, observer: RunObserver = NO_OBSERVER, scope: CancelScope | None = None
) -> FlowSummary:
    """The run inside a flow run: :func:`~recall_tasks.pipeline.conduct.conduct`'s steps, hosted by Prefect."""
    if deployment_run():
        trust.check_flow_run(params)
    return conduct(params, PrefectHost(get_run_logger()), observer=observer, scope=scope)


class PrefectHost:
    """:class:`~recall_tasks.pipeline.conduct.RunHost` in a flow run: chunk tasks, artifacts, events."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def announce(self, plan: RunPlan) -> None:
        announce(plan, self.logger)

    @contextlib.contextmanager
    def chunks(self, plan: RunPlan) -> Iterator[PrefectChunks]:
        try:
            with chunk_runner(plan.params) as runner:
                yield PrefectChunks(plan, runner)
        except WorkerDied as exc:  # nothing committed, but a person is told (the run.failed alert)
            params = plan.params
            died = alerts.alert_for_worker_death(
                plan.dataset.name, plan.run_id, params.label, plan.dataset.uri, str(exc)
            )
            emit_event(died.name, resource=died.resource, payload=died.payload)
            raise

    def flow_run_id(self) -> str | None:
        return flow_run_id()

    def send(self, publication: publish.Publication) -> None:
        send(publication)


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

    if deployment_run():
        policy = trust.WorkerPolicy.from_environment()
        trust.check_storage_options(storage_options or {}, policy)
        trust.check_location("output_uri", output_uri, policy)
    storage = StorageConfig.from_options(storage_options or {})
    store = ResultStore(output_uri, storage, detect_format(output_uri, storage))
    if store.format == "parquet":
        raise ConfigError("maintain works on delta and iceberg outputs; parquet files are never rewritten")
    rows = maintain(store, keep_days, allow_short_retention=allow_short_retention)
    for row in rows:
        get_run_logger().info("maintained %s", row)
    return rows
