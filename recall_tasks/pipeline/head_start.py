"""The CLI's ad-hoc path before Prefect starts: the pre-flight checks and the head start on the first chunks.

Deployment runs use neither: their flow checks and plans the run itself. What these functions build is one
:class:`~recall_tasks.pipeline.run.Prepared`, which the CLI hands to ``flow.run_benchmark`` (through
``flow.HANDOFF`` around its call of the Prefect flow); the flow's
:func:`~recall_tasks.pipeline.steps.plan_run` takes the plan from it, or :func:`abandon` does when no flow did.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from concurrent.futures import Future

from recall_tasks.config import RunParams
from recall_tasks.io.blocks import RowBlock
from recall_tasks.pipeline import steps
from recall_tasks.pipeline.run import NO_OBSERVER, ChunkReport, HeadStart, Prepared, RunObserver, RunPlan


def preflight(params: RunParams) -> Prepared:
    """The checks of ``steps.check_run`` (the CLI runs them before Prefect starts); their notes: ``.notes``."""
    return Prepared(params, steps.check_run(params))


def plan_ahead(prepared: Prepared, observer: RunObserver | None = None) -> RunPlan:
    """The CLI's head start: plan the run and start judging its first chunks before Prefect is imported.

    Importing Prefect and creating the flow run take ~2 s of an ad-hoc run's start-up; the first chunks' judge
    calls wait on the network meanwhile instead of after it. As many chunks start as the flow keeps in flight
    (``--max-workers``: the same memory bound), so the judge has a full window of requests from the first one
    until the flow's own tasks take over; with one chunk, the judge idled at the end of that chunk until Prefect
    was up. The flow's ``steps.plan_run`` takes this plan, and each of these chunks' tasks takes its head start's
    result (``steps.score_chunk``): the chunk loop is unchanged, each row is judged once. Not with a run-time
    retriever (its calls would run twice). If the flow never takes the plan (Prefect could not start, an
    interrupt), :func:`abandon` cancels and keeps what was judged. Deployment runs do not plan ahead.
    """
    params = prepared.params
    # the flow's plan_run shares the limits (Prefect's up)
    on_wait = observer.waiting if observer is not None else None
    plan = steps.plan_run(params, prepared=prepared, log_notes=False, share=False, on_wait=on_wait)
    plan.window.observer = observer  # the head start's rows move the CLI's bar too
    prepared.plan = plan
    # Prefect imports httpx while the head start judges; the openai SDK peeks at sys.modules["httpx"] on every
    # response and broke on the half-imported module ("partially initialized module 'httpx'") in 5 runs of 6.
    # Imported here first, it is complete before the two threads overlap (Prefect would import it anyway).
    import anyio  # noqa: F401
    import httpx  # noqa: F401

    fleet_limited = bool(params.requests_per_minute or params.tokens_per_minute)  # needs the Prefect API first
    if (
        plan.retriever is None and params.task_runner == "threads" and not params.batch and not fleet_limited
    ):  # others: not judged here, or not live
        futures: list[Future[ChunkReport]] = []
        for seq, block in enumerate(itertools.islice(steps.blocks(plan), params.max_workers)):
            block = plan.prepare_block(block)
            key = steps.chunk_key(plan, block)
            future: Future[ChunkReport] = Future()
            plan.window.head_starts[seq] = HeadStart(key, future)
            futures.append(future)
            threading.Thread(
                target=_score_ahead, args=(plan, seq, block, key, future), name=f"recall-bench-head-start-{seq}",
                daemon=True,
            ).start()  # fmt: skip
        if futures:
            _wait_for_first_request(plan, futures)
    return plan


def _score_ahead(plan: RunPlan, seq: int, block: RowBlock, key: str, future: Future[ChunkReport]) -> None:
    try:
        future.set_result(steps.score_ahead(plan, seq, block, key))
    except BaseException as exc:  # noqa: BLE001 - handed to the task (or abandon) that takes it
        future.set_exception(exc)


def settle_all(plan: RunPlan) -> None:
    """Give every head start still held :data:`steps.ABORT_WAIT_S` to settle (after an abort cancelled them)."""
    for head in list(plan.window.head_starts.values()):
        with contextlib.suppress(BaseException):
            head.future.exception(timeout=steps.ABORT_WAIT_S)


#: How long the CLI waits for the head start's first judge request before it imports Prefect anyway.
FIRST_REQUEST_WAIT_S = 2.0


def _wait_for_first_request(plan: RunPlan, futures: list[Future[ChunkReport]]) -> None:
    """Let the head start send its first request before Prefect's import takes the interpreter.

    Everything before the first request is CPU (building the first prompts, the judge's client), and so is
    Prefect's import: run side by side they share the GIL and the first request waited for both. Once it is out,
    the judge waits on the network while Prefect imports. Returns at once for a chunk served from the caches or
    judged offline (they finish without a request), and after :data:`FIRST_REQUEST_WAIT_S` in any case.
    """
    if plan.breaker is None:
        return
    deadline = time.monotonic() + FIRST_REQUEST_WAIT_S
    while not plan.breaker.first_sent.wait(0.01) and not all(f.done() for f in futures) and time.monotonic() < deadline:
        pass


def abandon(prepared: Prepared, observer: RunObserver = NO_OBSERVER) -> int:
    """A plan made ahead that no flow took: cancel its judge calls, keep what was judged (the observer is told);
    returns the rows cached (0 once a flow took the plan: the flow keeps and closes it)."""
    plan = prepared.abandon_plan()
    if plan is None:
        return 0
    steps.abort(plan)
    settle_all(plan)
    try:
        return steps.keep_judged(plan, observer)
    finally:
        steps.release(plan)
        steps.let_go(plan)
