"""The run's steps, plain: plan it, judge the chunks, commit, publish, finish; its resources closed once, whatever
happens. The one lifecycle of a run, whoever starts it (the command line, ``evaluate()``, a deployment).

Two hosts run these same steps (:class:`RunHost`): the Prefect flow (``flow.run_benchmark``: chunk tasks with
Prefect's cache and retries, the progress artifact, artifacts and events, a flow run id in ``runs``) and
``local_run`` (``evaluate(..., prefect=False)``: the chunks on a thread pool of this process, nothing published).
A host decides where chunks are scored and where the publication goes; the order of the steps, the abort and the
closing of resources are here once, so the two cannot drift apart.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from recall_tasks import _heap
from recall_tasks._sync import CancelScope
from recall_tasks.config import RunParams
from recall_tasks.errors import RunInterrupted, StorageError
from recall_tasks.io.lease import LeaseLost
from recall_tasks.pipeline import commit, dask_paths, publish, steps
from recall_tasks.pipeline.batch import finish as batch_finish
from recall_tasks.pipeline.batch import settle as batch
from recall_tasks.pipeline.run import NO_OBSERVER, RunObserver, RunPlan
from recall_tasks.pipeline.window import ChunkExecutor, ChunkTally, score_chunks
from recall_tasks.summaries import FlowSummary


class RunHost(Protocol):
    """Where a run's chunks are scored and where what it publishes goes."""

    logger: Any

    def announce(self, plan: RunPlan) -> None:
        """The run's first log line."""
        ...

    def chunks(self, plan: RunPlan) -> AbstractContextManager[ChunkExecutor]:
        """The chunk executor for the chunk loop (started and stopped around it)."""
        ...

    def flow_run_id(self) -> str | None: ...

    def send(self, publication: publish.Publication) -> None:
        """Publish the run's artifacts and events (or drop them)."""
        ...


@dataclass(frozen=True)
class Judged:
    """Every chunk judged: the plan that judged them (a ``--batch`` run's serves its collected rows) and the tally."""

    plan: RunPlan
    tally: ChunkTally
    batch_columns: dict[str, Any]


def conduct(
    params: RunParams, host: RunHost, *, observer: RunObserver = NO_OBSERVER, scope: CancelScope | None = None
) -> FlowSummary:
    """Plan, judge, commit; close the run's resources once.

    Planning checks the inputs before it takes the run's lease (``steps.plan_run``). From the moment the plan exists
    until every chunk is judged, any exception (an interrupt included) aborts it here: judge calls cancelled, the
    judged rows kept and counted for ``observer`` (``steps.keep_judged``, once even if the chunk loop did it first).
    ``scope``: the run's cancel scope, for a caller that may cancel this run (and no other); a lease another
    attempt took over cancels it too, and the run then ends with :class:`~recall_tasks.io.lease.LeaseLost`.
    """
    params = dask_paths.absolute(params)  # a deployment's relative paths: this process's folder, not the workers'
    plan: RunPlan | None = None
    try:
        try:
            plan = steps.plan_run(params, on_wait=observer.waiting, scope=scope)
            plan.window.observer = observer
            for note in plan.notes:
                observer.note(note)
            judged = _judge(params, plan, host, observer)
        except BaseException as exc:
            if plan is not None:
                steps.abort(plan)
                steps.keep_judged(plan, observer)
                lost = plan.store.lease.lost if plan.store.lease is not None else None
                if lost is not None and isinstance(exc, RunInterrupted):  # the lease went: its renewal cancelled us
                    raise LeaseLost(f"{lost}: this attempt stopped judging; nothing committed by it") from None
            raise
        if not isinstance(judged, Judged):  # a batch run pending, or nothing to collect: nothing committed
            return judged
        return _commit(judged, host)
    finally:  # however the attempt ends, its resources close once and its lease goes (a no-op once committed)
        if plan is not None:
            try:
                steps.release(plan)
            finally:
                steps.let_go(plan)


def _judge(params: RunParams, plan: RunPlan, host: RunHost, observer: RunObserver) -> Judged | FlowSummary:
    """The steps once the run is planned and this attempt holds its lease, up to the last chunk."""
    host.announce(plan)
    columns: dict[str, Any] = {}
    if params.batch:  # the Batch API first: a pending run returns here, nothing committed
        settled = batch.settle(plan)
        if settled.pending is not None:  # pending, or nothing to collect (batch_collect_only): nothing committed
            if settled.pending["status"] == batch.IDLE and not plan.resumed:
                steps.finish_run(plan)  # no attempt to resume: the marker begin_run wrote goes
            return settled.pending
        columns = batch_finish.batch_columns(settled)
        plan = batch_finish.install(plan, settled)
    try:
        with host.chunks(plan) as executor:
            tally = score_chunks(plan, executor, observer)
    except StorageError as exc:  # mid-run: the checks had reached it. Judged rows kept by the abort (keep_judged)
        raise steps.store_outage(plan, exc) from None
    return Judged(plan, tally, columns)


def _commit(judged: Judged, host: RunHost) -> FlowSummary:
    """Commit, publish and finish a judged run; raise for its outcome (regressed, failed, budget exhausted)."""
    plan = judged.plan
    steps.check_lease(plan)
    try:
        committed = commit.commit_run(plan, judged.tally.parts, host.flow_run_id(), judged.batch_columns)
    except StorageError as exc:  # the rows are judged and cached (or spilled): the rerun commits them unpaid
        raise steps.store_outage(plan, exc) from None
    _heap.trim_heap()  # the commit's buffers back to the system before the report reads the rows
    summary, publication = publish.publish_run(plan, committed, host.logger)
    host.send(publication)
    steps.finish_run(plan)
    publish.raise_for_outcome(plan, summary)
    return summary
