"""Submit, check, resubmit and collect a ``--batch`` run's batches (the package docstring says how)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from recall_tasks._sync import run_sync
from recall_tasks.errors import JudgeConfigError, JudgeError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.io.columns import JUDGED_ROLES
from recall_tasks.judges import tokens
from recall_tasks.judges.base import JudgeRequest, JudgeResponse
from recall_tasks.judges.batch import ACTIVE, OutputLine
from recall_tasks.judges.capabilities import batching, prices_of
from recall_tasks.judges.pricing import BATCH_PRICE_FACTOR, price_for
from recall_tasks.pipeline.batch import remote
from recall_tasks.pipeline.batch.record import OPEN, Record, RecordChanged, now, outcomes, stored_params
from recall_tasks.pipeline.run import RunPlan
from recall_tasks.pipeline.scoring import keyed_requests, metric_fingerprint
from recall_tasks.summaries import IdleSummary, PendingSummary

log = logging.getLogger(__name__)

#: The status of a run whose batches are not collected yet (returned by the flow, never committed).
PENDING: Literal["batch_pending"] = "batch_pending"
#: The status a ``batch_collect_only`` run returns when its parameters have no pending batches (nothing done).
IDLE: Literal["batch_idle"] = "batch_idle"


# -- the record (its format: :mod:`recall_tasks.pipeline.batch.record`) ----------------------------------


# -- what the run needs ------------------------------------------------------------------------------------


def misses(plan: RunPlan) -> dict[str, JudgeRequest]:
    """The judge requests of the rows the row cache cannot serve, by row-cache key (dataset order)."""
    metric = plan.metric
    fingerprint = metric_fingerprint(metric)
    cache = plan.cache
    out: dict[str, JudgeRequest] = {}

    columns = list(JUDGED_ROLES)
    for raw in iter_blocks(plan.dataset, plan.params.chunk_size):
        block = plan.prepare_block(raw)
        pairs = run_sync(keyed_requests(metric, fingerprint, block.table.select(columns).to_pylist()))
        hits = cache.get_many([k for k, _ in pairs]) if cache is not None else {}
        out.update((k, r) for k, r in pairs if k not in hits)
    return out


@dataclass
class Settled:
    """What :func:`settle` found: ``pending`` (a summary to return) or the keys to serve and the failures, with
    the batch ids and the seconds from the first submit to the collect (``runs.batch_ids``, ``batch_wait_s``)."""

    pending: PendingSummary | IdleSummary | None = None
    collected: set[str] = field(default_factory=set)
    failures: dict[str, str] = field(default_factory=dict)
    batch_ids: list[str] | None = None
    wait_s: float | None = None
    served: dict[str, JudgeResponse] | None = None  # the collected answers, when this process collected them


def _finished(record: dict[str, Any]) -> Settled:
    """A collected record as :class:`Settled` (the finish of a collected run, or its resumption)."""
    submitted, collected = record.get("submitted_ts"), record.get("collected_ts")
    wait = collected - submitted if isinstance(submitted, int | float) and isinstance(collected, int | float) else None
    return Settled(
        collected=set(record.get("collected") or []), failures=dict(record.get("failures") or {}),
        batch_ids=[p["batch_id"] for p in record["parts"] if p.get("batch_id")], wait_s=wait,
    )  # fmt: skip


def settle(plan: RunPlan) -> Settled:
    """Submit, check, resubmit or collect the run's batches (see the package docstring); waits with ``--wait``.

    One writer at a time: every write of the record is a compare-and-swap, and a waiting run re-reads it before
    each check. When another process wrote it in between (``batch cancel``, another collector), this run stops,
    nothing committed: it never writes over a cancel, never resubmits a cancelled record and never creates a round
    2 that the other process created (a batch it created that the record cannot take is cancelled at once)."""
    try:
        return _settle(plan)
    except RecordChanged:
        return Settled(pending=_superseded(plan))


def _superseded(plan: RunPlan) -> PendingSummary | IdleSummary:
    """What a run returns when another process wrote its record: the record as that process left it."""
    fresh = remote.read_record(plan)
    status = None if fresh is None else fresh.get("status")
    log.warning("the batch record %s was written by another process (now %s); this run stops here, nothing "
                "committed", remote.record_uri(plan), status)  # fmt: skip
    if fresh is not None and status in OPEN:
        return pending_summary(plan, fresh, sum(len(p["custom_ids"]) for p in fresh["parts"] if p.get("round") == 1))
    why = f"another process left the batches of run {plan.run_id} {status or 'without a record'}"
    return idle_summary(plan, fresh, f"stopped: {why} (record {remote.record_uri(plan)})")


def _settle(plan: RunPlan) -> Settled:
    params = plan.params
    record = remote.read_record(plan)
    status = record.get("status") if record is not None else None
    if record is not None and status == "collected" and record.get("run_id") == plan.run_id:
        log.info("batches of run %s already collected; finishing the run", plan.run_id)  # a resumed finish
        return _finished(record)
    if params.batch_collect_only and status not in OPEN:
        return Settled(pending=idle_summary(plan, record))
    token = None if record is None else record.token  # a new record replaces this version, or none
    if record is not None and status == "cancelled":
        log.warning("the batches of run %s were cancelled at %s; submitting new batches", record.get("run_id"),
                    record.get("cancelled_at"))  # fmt: skip
        record = None
    elif status == "collected":
        record = None  # an earlier run's batches: this run starts its own
    requests = misses(plan)
    if record is None:
        if not requests:
            return Settled()
        requests = within_budget(plan, requests)
        record = _new_record(plan, requests, token)
    remote.submit(plan, record, requests)
    texts: dict[str, tuple[str, str]] = {}
    deadline = None if params.batch_timeout_s is None else time.monotonic() + params.batch_timeout_s
    first = True
    while True:
        if not first:
            remote.unchanged(plan, record)  # a cancel or another collector since the last check: stop (RecordChanged)
        first = False
        remote.refresh(plan, record)
        if not any(p.get("status") in ACTIVE for p in record["parts"]):
            if _resubmit(plan, record, requests, texts):
                continue
            break
        if not params.batch_wait or (deadline is not None and time.monotonic() >= deadline):
            if params.batch_wait:
                log.warning("--batch-timeout %gs reached; the batches are still running", params.batch_timeout_s)
            return Settled(pending=pending_summary(plan, record, len(requests)))
        time.sleep(params.poll_interval_s if deadline is None else
                   max(0.0, min(params.poll_interval_s, deadline - time.monotonic())))  # fmt: skip
    return _collect(plan, record, requests, texts)


def within_budget(plan: RunPlan, requests: dict[str, JudgeRequest]) -> dict[str, JudgeRequest]:
    """The requests a new batch may hold under ``--max-requests`` / ``--max-cost-usd`` (dataset order).

    A line's cost is bounded from above at the batch price: its prompt tokens at most (the one estimate of its
    body, messages and schema: :func:`~recall_tasks.judges.tokens.request_tokens`) plus its full completion budget
    (``max_tokens``). The rows left out are not submitted; the finish records them "not judged"
    (the batch's spend counts toward the budget there, ``finish.install``)."""
    params = plan.params
    if params.max_requests is None and params.max_cost_usd is None:
        return requests
    judge = batching(plan.metric.judge)
    price = price_for(judge.model, prices_of(judge))
    kept: dict[str, JudgeRequest] = {}
    cost = 0.0
    for key, request in requests.items():
        if params.max_requests is not None and len(kept) >= params.max_requests:
            break
        if price is not None:  # the bound is reported under --max-requests too
            prompt, out = tokens.request_tokens(judge.batch_body(request))
            line = (prompt * price[0] + out * price[1]) / 1e6 * BATCH_PRICE_FACTOR
            if params.max_cost_usd is not None and cost + line > params.max_cost_usd:
                break
            cost += line
        kept[key] = request
    if len(kept) < len(requests):
        bound = f"at most ${cost:.4f}" if cost >= 0.01 else f"at most ${cost:.2g}"  # never $0.0000 for some rows
        bound = "cost unknown: no price for this model" if price is None else f"{bound} at the batch price"
        log.warning("the budget (--max-requests / --max-cost-usd) lets %d of %d row(s) into the batch (%s); the "
                    "rest are not judged", len(kept), len(requests), bound)  # fmt: skip
    return kept


def _new_record(plan: RunPlan, requests: Mapping[str, JudgeRequest], token: str | None) -> Record:
    judge = batching(plan.metric.judge)
    record = Record({
        "run_key": plan.run_key, "run_id": plan.run_id, "status": "submitting", "submitted_at": now(),
        "submitted_ts": time.time(), "model": judge.model, "endpoint": judge.endpoint,
        "params": stored_params(plan.params), "batch_fallback": plan.params.batch_fallback,
        "parts": remote.parts(plan, requests, list(requests), 1),
    })  # fmt: skip
    record.token = token
    remote.write_record(plan, record)
    return record


def _resubmit(
    plan: RunPlan, record: Record, requests: Mapping[str, JudgeRequest], texts: dict[str, tuple[str, str]]
) -> bool:
    """Every batch ended: submit the lines left unanswered (failed, expired, cancelled, missing) ONCE in new
    batches (round 2, same record). Not with ``--batch-fallback live`` (those lines are judged live). True if
    round 2 was submitted now."""
    if plan.params.batch_fallback == "live" or "resubmitted" in record:
        return False
    remote.download(plan, record, texts)
    answers, _ = outcomes(record, texts)
    retry = [k for p in record["parts"] for k in p["custom_ids"] if k not in answers and k in requests]
    record["resubmitted"] = len(retry)
    if retry:
        record["parts"].extend(remote.parts(plan, requests, retry, 2))
    remote.write_record(plan, record)  # round 2 recorded before any upload: a crash is resumed by the rerun
    if not retry:
        return False
    remote.submit(plan, record, requests)
    ids = ", ".join(p["batch_id"] for p in record["parts"] if p.get("round") == 2)
    log.info("resubmitted %d unanswered line(s) once, in batch(es) %s", len(retry), ids)
    return True


def pending_summary(plan: RunPlan, record: dict[str, Any], rows: int) -> PendingSummary:
    """What the flow returns for a pending run: its batches, nothing committed."""
    return {
        "status": PENDING, "run_id": plan.run_id, "run_key": plan.run_key, "rows": plan.dataset.num_rows,
        "batched_rows": rows, "record": remote.record_uri(plan), "output": plan.params.output_uri,
        "base_url": plan.params.base_url, "submitted_at": record.get("submitted_at"),
        "batches": [{"id": p["batch_id"], "status": p.get("status"), "requests": len(p["custom_ids"]),
                     "round": p.get("round", 1), "counts": p.get("request_counts")} for p in record["parts"]],
    }  # fmt: skip


def idle_summary(plan: RunPlan, record: dict[str, Any] | None, reason: str | None = None) -> IdleSummary:
    """What a ``batch_collect_only`` run returns when these parameters have no pending batches: nothing done."""
    if reason is not None:
        return {"status": IDLE, "run_id": plan.run_id, "run_key": plan.run_key, "record": remote.record_uri(plan),
                "reason": reason}  # fmt: skip
    if record is None:
        why = "no batches were submitted for these parameters and this data"
    else:
        why = f"the batches of run {record.get('run_id')} are {record.get('status')}"
    return {"status": IDLE, "run_id": plan.run_id, "run_key": plan.run_key, "record": remote.record_uri(plan),
            "reason": f"nothing to collect: {why}"}  # fmt: skip


def _collect(
    plan: RunPlan, record: Record, requests: Mapping[str, JudgeRequest], texts: dict[str, tuple[str, str]]
) -> Settled:
    """Every batch ended: parse the outputs into the row cache; the rest are failures (or judged live)."""
    judge = batching(plan.metric.judge)
    remote.download(plan, record, texts)
    answers, failures = outcomes(record, texts)

    async def finish(key: str, batch_id: str, line: OutputLine) -> tuple[str, JudgeResponse | str]:
        try:
            response = await judge.finish_batch_reply(
                requests[key], line.content or "", line.finish_reason, (line.prompt_tokens, line.completion_tokens)
            )
        except JudgeConfigError:
            raise
        except JudgeError as exc:
            return key, f"batch {batch_id} line {line.line}: {exc}"
        flags = [f"judged in batch {batch_id}", *response.flags]
        return key, response.model_copy(update={"flags": flags})

    async def finish_all() -> list[tuple[str, JudgeResponse | str]]:
        known = [(k, b, line) for k, (b, line) in answers.items() if k in requests]
        return list(await asyncio.gather(*(finish(k, b, line) for k, b, line in known)))

    collected: dict[str, JudgeResponse] = {}
    for key, outcome in plan.scope.run(finish_all()):
        if isinstance(outcome, str):
            failures[key] = outcome
        else:
            collected[key] = outcome
    if plan.cache is not None and collected:
        plan.cache.put_many(collected, flush=False)
        plan.cache.flush()
    record.update(status="collected", collected_at=now(), collected_ts=time.time(), collected=sorted(collected),
                  failures=failures)  # fmt: skip
    record["cost_usd"] = sum(r.cost_usd or 0.0 for r in collected.values())
    remote.write_record(plan, record)
    done = _finished(record)
    done.served = collected
    log.info(
        "collected %d row(s) from %d batch(es) (%s); %d failed line(s)%s", len(collected), len(record["parts"]),
        ", ".join(p["batch_id"] for p in record["parts"]), len(failures),
        " judged live (--batch-fallback live)" if failures and plan.params.batch_fallback == "live" else "",
    )  # fmt: skip
    return done
