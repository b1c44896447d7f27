"""Scoring a block of rows: one async judge call per row, bounded by the judge, errors kept per row.

``score_block`` is the one place every row goes through, and the seam where caches plug in: it asks the
optional ``RowCache`` for verdicts by content key first and judges only the misses. Errors:
- a missing input under ``on_missing="error"``, a judge reply that stays unusable, transient failures past
  the retry budget: the row is recorded with its error, the block goes on;
- :class:`JudgeConfigError` (auth, quota, bad model): re-raised, the run stops before anything is written;
- a request the endpoint rejected (:class:`JudgeRejectedError`: a context too long, a proxy's 413): the row's
  error; rejections in a row with none accepted trip the breaker (below), as a rejection every request meets;
  a prompt over the model's window that was not sent (:class:`ContextOverflowError`) costs the row no request;
- an outage (the endpoint refuses, resets, times out or fails with 5xx again and again): the run's
  :class:`~recall_tasks.fleet.guards.CircuitBreaker` trips, the calls in flight are cancelled and every row
  not judged yet is recorded "not judged" with the breaker's reason (the run's status becomes ``failed``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import pyarrow as pa

from recall_tasks.errors import (
    ContextOverflowError,
    JudgeConfigError,
    JudgeError,
    JudgeRejectedError,
    MissingInputError,
)
from recall_tasks.fleet.guards import NOT_JUDGED, Budget, CircuitBreaker
from recall_tasks.io.blocks import RowBlock
from recall_tasks.io.columns import JUDGED_ROLES
from recall_tasks.judges.base import (
    BudgetReached,
    JudgeRequest,
    JudgeResponse,
    Spend,
    attempt_gate,
    attempt_observer,
    charge,
    spend_of,
    take_spend,
)
from recall_tasks.judges.capabilities import Prepaid, gates_attempts
from recall_tasks.judges.claims import ClaimsReply
from recall_tasks.metrics.base import Metric, Missing, Prepared
from recall_tasks.metrics.claims import Guard, NotJudged, Units, claim_units_of
from recall_tasks.models import RecallCase
from recall_tasks.pipeline import progress
from recall_tasks.pipeline.results_table import RowOutcome, results_table
from recall_tasks.pipeline.shared import SHARED_FLAG, Shared, SharedRequests
from recall_tasks.sentences import SPLITTER_VERSION


class RowCache(Protocol):
    """Row-level verdict cache (content addressed). Implemented by the caching layer."""

    def get_many(self, keys: list[str]) -> dict[str, JudgeResponse]: ...

    def put_many(self, entries: dict[str, JudgeResponse], *, flush: bool = True) -> bool: ...

    def flush(self) -> None: ...


def metric_fingerprint(metric: Metric) -> str:
    """Hash of everything about a metric and its judge that changes verdicts (never secrets)."""
    config = {
        "task": metric.task,
        "include_reason": metric.include_reason,
        "splitter": SPLITTER_VERSION,
        "judge": metric.judge.config(),
    }
    claim_units = claim_units_of(metric)
    if claim_units is not None:  # only then: the sentence mode's fingerprint (and its caches) stay what they were
        config["units"] = "claims"
        config["extractor"] = claim_units.extractor.claims_config()
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:24]


def row_cache_key(fingerprint: str, prepared: Prepared) -> str:
    """Content address of one judge request under one metric configuration."""
    return request_key(fingerprint, prepared.request)


def request_key(fingerprint: str, r: JudgeRequest) -> str:
    """:func:`row_cache_key` of a bare request (what a judge sees; the Batch API's ``custom_id``)."""
    payload = json.dumps([fingerprint, r.question, r.statements, r.evidence], ensure_ascii=False)
    return hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _case(row: dict[str, Any]) -> RecallCase:
    ctx = row.get("retrieval_context")
    return RecallCase(
        input=row.get("input"),
        expected_output=row.get("expected_output"),
        retrieval_context=None if ctx is None else [c if c is not None else "" for c in ctx],
        actual_output=row.get("actual_output"),
    )


async def keyed_requests(
    metric: Metric, fingerprint: str, rows: list[dict[str, Any]], units: Sequence[Units | None] | None = None
) -> list[tuple[str, JudgeRequest]]:
    """Each assessable row's judge request with its row-cache key, rows missing an input left out: what a batch
    submits and what a dry run prices (``units``: each row's claims when known)."""
    found = []
    for i, row in enumerate(rows):
        case = _case(row)
        prepared = metric.prepare(case, await metric.resolve_context(case), units[i] if units is not None else None)
        if not isinstance(prepared, Missing):
            found.append((row_cache_key(fingerprint, prepared), prepared.request))
    return found


async def score_rows(
    metric: Metric,
    rows: list[dict[str, Any]],
    cache: RowCache | None = None,
    budget: Budget | None = None,
    breaker: CircuitBreaker | None = None,
    shared: SharedRequests | None = None,
) -> list[RowOutcome]:
    """Score rows concurrently; the judge bounds concurrency. A JudgeConfigError cancels the rest.

    Cache hits are finalised without a judge call; each fresh response is handed to the cache as soon as it
    arrives (so a crash loses little); rows past the budget, or after the breaker tripped, are marked not
    assessed with the reason. Rows with the same row-cache key send one request (``shared``: also with the
    other chunks of the run in this process): the others take its verdict at no cost (:data:`SHARED_FLAG`), its
    error, or its "not judged".
    """
    shared = shared if shared is not None else SharedRequests()
    outcomes: list[RowOutcome | None] = [None] * len(rows)
    pending: list[tuple[int, Prepared, str]] = []
    fingerprint = metric_fingerprint(metric)
    cases = [_case(row) for row in rows]
    contexts = [await metric.resolve_context(case) for case in cases]
    token = attempt_observer.set(breaker)  # claim extractions (if any) report their attempts too
    try:
        claim_units = claim_units_of(metric)
        extractor = claim_units.extractor if claim_units is not None else None
        units = await metric.resolve_units(cases, contexts, _guard(budget, breaker, extractor))
    finally:
        attempt_observer.reset(token)
    for i, case in enumerate(cases):
        if i % 32 == 31:  # this loop shares its thread with every judge call in flight: let replies in
            await asyncio.sleep(0)
        context = contexts[i]
        unit = units[i]
        if isinstance(unit, BaseException):
            spent = take_spend(unit)  # the first row of the reference records what its extraction cost
            if isinstance(unit, NotJudged):
                result = metric.not_assessed(NOT_JUDGED + unit.reason, context_count=len(context or []))
                outcomes[i] = RowOutcome(result, None, spent=spent)
            else:
                what = f"claim extraction failed: {type(unit).__name__}: {unit}"
                outcomes[i] = RowOutcome(None, what, spent=spent)
            continue
        prepared = metric.prepare(case, context, unit)
        if isinstance(prepared, Missing):
            try:
                outcomes[i] = RowOutcome(metric.missing_result(prepared, len(context or [])), None)
            except MissingInputError as exc:
                outcomes[i] = RowOutcome(None, exc.with_flags())
            continue
        pending.append((i, prepared, row_cache_key(fingerprint, prepared)))

    # the first row of a key not in flight leads it, registered before the cache lookup: a request of another chunk
    # that ends meanwhile is then in the cache (put before it leaves the registry) or still in flight, never missed
    leaders: list[tuple[int, Prepared, str]] = []
    waiting: list[tuple[int, Prepared, asyncio.Future[Shared]]] = []
    for i, prepared, key in pending:
        request = shared.lead(key)
        if request is None:
            leaders.append((i, prepared, key))
        else:
            waiting.append((i, prepared, request))
    to_judge = []
    tell = progress.rows_settled.get()
    try:
        hits = await asyncio.to_thread(cache.get_many, [k for _, _, k in leaders]) if cache and leaders else {}
        owed = getattr(cache, "owed", None)  # judged by an earlier attempt of this run: its spend is this run's
        for i, prepared, key in leaders:
            if key in hits:
                paid_earlier = owed is not None and owed(key, hits[key])
                outcomes[i] = RowOutcome(metric.finalize(prepared, hits[key], 0.0), None, cached=not paid_earlier)
                shared.served(key, hits[key])
            else:
                to_judge.append((i, prepared, key))
    except BaseException:
        for _, _, key in leaders:
            shared.drop(key)
        raise
    if tell is not None:
        tell(len(rows) - len(to_judge) - len(waiting))  # settled without a judge call

    def extracted(prepared: Prepared) -> Spend:
        """The claim extraction a row paid for: recorded whether or not the row is then judged."""
        return prepared.units.spend if prepared.units is not None else Spend()

    def not_judged(prepared: Prepared, why: str, spent: Spend | None = None) -> RowOutcome:
        result = metric.not_assessed(
            NOT_JUDGED + why, sentence_count=prepared.sentence_count, context_count=prepared.context_count
        )
        return RowOutcome(result, None, spent=extracted(prepared) + (spent or Spend()))

    # a collected batch's answers: paid already, never held back
    prepaid = metric.judge.prepaid if isinstance(metric.judge, Prepaid) else None
    gated = gates_attempts(metric.judge)  # its attempts reserve as they are sent

    async def judge_one(i: int, prepared: Prepared, key: str) -> Shared:
        if breaker is not None and breaker.tripped_reason is not None:
            outcomes[i] = not_judged(prepared, breaker.tripped_reason)
            return Shared(not_judged=breaker.tripped_reason)
        gate = None if budget is None or (prepaid is not None and prepaid(prepared.request)) else budget
        call = gate.call(gated) if gate is not None else None
        if gate is not None and not await gate.reserve(call):
            outcomes[i] = not_judged(prepared, gate.exhausted_reason or "budget")
            return Shared(not_judged=gate.exhausted_reason or "budget")
        started = time.perf_counter()
        response: JudgeResponse | None = None
        failed = Spend(requests=1)
        task = asyncio.current_task()
        if breaker is not None and task is not None:
            breaker.enter(task)
        token = attempt_gate.set(call)
        try:
            response = await metric.judge.judge(prepared.request)
        except JudgeConfigError:
            raise
        except BudgetReached as exc:  # an attempt the budget could not pay for was not sent
            failed = spend_of(exc)
            outcomes[i] = not_judged(prepared, exc.reason, failed)
            return Shared(not_judged=exc.reason)
        except JudgeError as exc:
            spent = spend_of(exc)
            sent = spent.requests if isinstance(exc, ContextOverflowError) else max(spent.requests, 1)
            failed = Spend(sent, spent.prompt_tokens, spent.completion_tokens, spent.cost_usd)
            error = f"{type(exc).__name__}: {exc}"
            outcomes[i] = RowOutcome(None, error, spent=extracted(prepared) + failed)
            _rejected(breaker, exc)
            return Shared(error=error)
        except asyncio.CancelledError as exc:
            made = breaker.attempts_of(task) if breaker is not None and task is not None else 0
            if breaker is None or task is None or not breaker.leave(task):
                raise
            task.uncancel()  # cancelled by the breaker, not by the caller: the row is "not judged"
            failed = replace(spend_of(exc), requests=made)
            reason = breaker.tripped_reason or "circuit breaker"
            outcomes[i] = not_judged(prepared, reason, failed)
            return Shared(not_judged=reason)
        finally:
            attempt_gate.reset(token)
            if breaker is not None and task is not None:
                breaker.leave(task)
            if gate is not None:
                if response is not None:
                    gate.release(response.requests, response.cost_usd, call)
                else:
                    gate.release(failed.requests, failed.cost_usd, call)
        if breaker is not None:
            breaker.request_answered()
        latency_ms = (time.perf_counter() - started) * 1000
        outcomes[i] = RowOutcome(metric.finalize(prepared, response, latency_ms), None)
        if cache is not None and not response.substituted and cache.put_many({key: response}, flush=False):
            await asyncio.to_thread(cache.flush)
        return Shared(response=response, latency_ms=latency_ms)

    def follow(prepared: Prepared, result: Shared) -> RowOutcome:
        """A row whose identical row's request ``result`` came from: its verdict (unpaid), error or "not judged"."""
        if result.response is not None and result.cached:
            return RowOutcome(metric.finalize(prepared, result.response, 0.0), None, cached=True)
        if result.response is not None:
            r = result.response
            free = r.model_copy(update={"requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                        "cost_usd": None if r.cost_usd is None else 0.0,
                                        "flags": [*r.flags, SHARED_FLAG]})  # fmt: skip
            return RowOutcome(metric.finalize(prepared, free, result.latency_ms), None)
        if result.error is not None:
            return RowOutcome(None, result.error, spent=extracted(prepared))
        return not_judged(prepared, result.not_judged or "not judged")

    async def wait_for(i: int, prepared: Prepared, request: asyncio.Future[Shared]) -> None:
        try:
            result = await asyncio.shield(request)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            result = Shared(not_judged="the request of an identical row was cancelled")
        outcomes[i] = follow(prepared, result)

    if to_judge or waiting:
        token = attempt_observer.set(breaker)  # the judge tasks started below report their attempts to it
        try:
            async with asyncio.TaskGroup() as group:
                tasks: list[asyncio.Task[Any]] = []
                for i, prepared, key in to_judge:
                    tasks.append(group.create_task(judge_one(i, prepared, key)))
                    shared.led_by(key, tasks[-1])
                for i, prepared, request in waiting:
                    tasks.append(group.create_task(wait_for(i, prepared, request)))
                progress.tell_each(tasks, tell)
        except BaseExceptionGroup as group_error:  # the first configuration error stops the block
            raise group_error.exceptions[0] from None
        finally:
            attempt_observer.reset(token)
    return [o if o is not None else RowOutcome(None, "internal: row not scored") for o in outcomes]


def _rejected(breaker: CircuitBreaker | None, exc: JudgeError) -> None:
    """Tell the breaker about a call the endpoint rejected (not one refused before sending: the endpoint's answer
    to the others is unknown)."""
    if breaker is not None and isinstance(exc, JudgeRejectedError) and not isinstance(exc, ContextOverflowError):
        breaker.request_rejected(str(exc))


def _guard(budget: Budget | None, breaker: CircuitBreaker | None, extractor: Any = None) -> Guard:
    """One extra call (a claim extraction) under the run's budget and circuit breaker, as a judge call is."""

    async def guarded(call: Callable[[], Awaitable[ClaimsReply]]) -> ClaimsReply:
        if breaker is not None and breaker.tripped_reason is not None:
            raise NotJudged(breaker.tripped_reason)
        gate = budget.call(gates_attempts(extractor)) if budget is not None else None
        if budget is not None and not await budget.reserve(gate):
            raise NotJudged(budget.exhausted_reason or "budget")
        task = asyncio.current_task()
        if breaker is not None and task is not None:
            breaker.enter(task)
        requests, cost = 1, None
        token = attempt_gate.set(gate)
        try:
            reply = await call()
            requests, cost = reply.requests, reply.cost_usd
            if breaker is not None:
                breaker.request_answered()
            return reply
        except JudgeError as exc:
            requests, cost = max(exc.requests, 1), spend_of(exc).cost_usd
            _rejected(breaker, exc)
            raise
        except BudgetReached as exc:  # an attempt the budget could not pay for was not sent
            stopped = NotJudged(exc.reason)
            charge(stopped, spend_of(exc))
            requests, cost = spend_of(exc).requests, spend_of(exc).cost_usd
            raise stopped from None
        except asyncio.CancelledError as exc:
            made = breaker.attempts_of(task) if breaker is not None and task is not None else 0
            if breaker is None or task is None or not breaker.leave(task):
                raise
            task.uncancel()
            stopped = NotJudged(breaker.tripped_reason or "circuit breaker")
            charge(stopped, replace(spend_of(exc), requests=made))  # the attempts it made before the breaker
            requests, cost = made, spend_of(stopped).cost_usd
            raise stopped from None
        finally:
            attempt_gate.reset(token)
            if breaker is not None and task is not None:
                breaker.leave(task)
            if budget is not None:
                budget.release(requests, cost, gate)

    return guarded


async def score_block(
    metric: Metric,
    block: RowBlock,
    cache: RowCache | None = None,
    budget: Budget | None = None,
    breaker: CircuitBreaker | None = None,
    shared: SharedRequests | None = None,
) -> pa.Table:
    """Score every row of ``block``; its result table has no run columns (added at commit, see results.py).

    Converting the block and building its table run in a worker thread: on the event loop they would hold
    every judge reply in flight for tens of milliseconds per chunk.
    """
    columns = list(JUDGED_ROLES)
    rows = await asyncio.to_thread(lambda: block.table.select(columns).to_pylist())
    outcomes = await score_rows(metric, rows, cache, budget, breaker, shared)
    return await asyncio.to_thread(results_table, block, outcomes, metric)
