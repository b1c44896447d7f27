"""The benchmark run without Prefect: the flow's steps in this process, for ``evaluate(..., prefect=False)``.

A notebook or a script that wants a DataFrame of scores should not need a Prefect server: Prefect's own answer
without one (an "ephemeral" server booted inside the process) costs seconds per call and times out under load
(``cli/server.py``). :func:`run_in_process` runs the very steps of ``pipeline/flow.recall_benchmark``
(``pipeline/conduct.py``, hosted here by :class:`LocalHost`), with the same parameters and tables: plan (checks,
lease, row cache, budgets), the chunk loop (``window.score_chunks``: bounded window, abort on any error), commit,
publish (comparison with the baseline, HTML report), finish, and the outcome's exceptions. What Prefect adds
and this path does not have:

- no flow run, artifacts or events (``publish_run``'s publication is dropped; ``flow_run_id`` is null in ``runs``);
- no chunk cache and no task retries: each chunk is scored by a thread of a pool of ``--max-workers``; the row
  verdict cache still serves every row judged before, and the judge still retries its own transient failures;
- ``--task-runner threads`` only (processes and dask are Prefect task runners); ``--rpm``/``--tpm`` are per process.

``tests/test_evaluate.py`` checks that this path and the Prefect flow write the same results for the same data.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from recall_tasks._sync import CancelScope
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.pipeline import steps
from recall_tasks.pipeline.conduct import conduct
from recall_tasks.pipeline.publish import Publication
from recall_tasks.pipeline.run import NO_OBSERVER, ChunkReport, RunObserver, RunPlan
from recall_tasks.summaries import FlowSummary

log = logging.getLogger("recall_tasks.run")


class _PoolHandle:
    def __init__(self, future: Future[ChunkReport]) -> None:
        self._future = future

    def wait(self, timeout: float) -> bool:
        try:
            self._future.exception(timeout)
        except TimeoutError:
            return False
        return True

    def report(self) -> ChunkReport:
        return self._future.result()


class ThreadChunks:
    """:class:`~recall_tasks.pipeline.window.ChunkExecutor` on a thread pool: no task runs."""

    def __init__(self, plan: RunPlan, pool: ThreadPoolExecutor) -> None:
        self.plan = plan
        self.pool = pool

    def submit(self, seq: int, key: str) -> _PoolHandle:
        return _PoolHandle(self.pool.submit(steps.score_chunk, self.plan, seq, self.plan.pending_blocks[seq], key))

    def progress(self, done_rows: int, total_rows: int, *, final: bool) -> None:
        return None


class LocalHost:
    """:class:`~recall_tasks.pipeline.conduct.RunHost` without Prefect: chunks on a thread pool, nothing published."""

    logger = log

    def announce(self, plan: RunPlan) -> None:
        log.info(
            "run %s%s: %s rows from %s, metric %s, judge %s", plan.run_id, " (resumed)" if plan.resumed else "",
            plan.dataset.num_rows, plan.dataset.uri, plan.params.metric, plan.metric.judge.model,
        )  # fmt: skip

    @contextlib.contextmanager
    def chunks(self, plan: RunPlan) -> Iterator[ThreadChunks]:
        with ThreadPoolExecutor(plan.params.max_workers, thread_name_prefix="recall-chunk") as pool:
            yield ThreadChunks(plan, pool)

    def flow_run_id(self) -> str | None:
        return None

    def send(self, publication: Publication) -> None:
        return None  # artifacts and events are Prefect's: dropped


def run_in_process(
    params: RunParams, observer: RunObserver = NO_OBSERVER, scope: CancelScope | None = None
) -> FlowSummary:
    """Score ``params``'s dataset in this process and commit as the flow does; returns the flow's summary.

    Raises what the flow raises: one clear error before anything is judged, ``RunFailed``/``BudgetExhausted``/
    ``RegressionDetected``/``IncomparableBaseline`` after the commit (the summary in ``exc.summary``). ``observer``:
    told the progress as the CLI's bar is. ``scope``: cancels this run (``evaluate()``'s caller cancelling it).
    """
    if params.task_runner != "threads":
        raise ConfigError(
            f"task_runner={params.task_runner!r} runs chunks as Prefect tasks: pass prefect=True, or keep 'threads'"
        )
    return conduct(params, LocalHost(), observer=observer, scope=scope)
