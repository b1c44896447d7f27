"""Submit, check, resubmit and collect a ``--batch`` run's batches (the package docstring says how)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from recall_tasks._sync import run_sync
from recall_tasks.errors import ConfigError, JudgeConfigError, JudgeError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.judges.base import JudgeRequest, JudgeResponse
from recall_tasks.judges.batch import ACTIVE, OutputLine, request_line, split
from recall_tasks.metrics.base import Missing
from recall_tasks.pipeline.batch.record import OPEN, now, outcomes, read_at, record_file, stored_params, write_at
from recall_tasks.pipeline.scoring import _case, metric_fingerprint, row_cache_key
from recall_tasks.pipeline.steps import RunPlan
from recall_tasks.summaries import IdleSummary, PendingSummary

log = logging.getLogger(__name__)

#: The status of a run whose batches are not collected yet (returned by the flow, never committed).
PENDING: Literal["batch_pending"] = "batch_pending"
#: The status a ``batch_collect_only`` run returns when its parameters have no pending batches (nothing done).
IDLE: Literal["batch_idle"] = "batch_idle"


# -- the record (its format: :mod:`recall_tasks.pipeline.batch.record`) ----------------------------------


def record_path(plan: RunPlan) -> str:
    return record_file(plan.store, plan.run_key)


def read_record(plan: RunPlan) -> dict[str, Any] | None:
    return read_at(plan.store.fs, record_path(plan))


def write_record(plan: RunPlan, record: dict[str, Any]) -> None:
    write_at(plan.store.fs, record_path(plan), record)


# -- what the run needs ------------------------------------------------------------------------------------


def misses(plan: RunPlan) -> dict[str, JudgeRequest]:
    """The judge requests of the rows the row cache cannot serve, by row-cache key (dataset order)."""
    metric = plan.metric
    fingerprint = metric_fingerprint(metric)
    cache = plan.cache
    out: dict[str, JudgeRequest] = {}

    async def prepare(rows: list[dict[str, Any]]) -> list[tuple[str, JudgeRequest]]:
        found = []
        for row in rows:
            case = _case(row)
            prepared = metric.prepare(case, await metric.resolve_context(case))
            if not isinstance(prepared, Missing):
                found.append((row_cache_key(fingerprint, prepared), prepared.request))
        return found

    columns = ["input", "expected_output", "retrieval_context", "actual_output"]
    for raw in iter_blocks(plan.dataset, plan.params.chunk_size):
        block = plan.prepare_block(raw)
        pairs = run_sync(prepare(block.table.select(columns).to_pylist()))
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


def _finished(record: dict[str, Any]) -> Settled:
    """A collected record as :class:`Settled` (the finish of a collected run, or its resumption)."""
    submitted, collected = record.get("submitted_ts"), record.get("collected_ts")
    wait = collected - submitted if isinstance(submitted, int | float) and isinstance(collected, int | float) else None
    return Settled(
        collected=set(record.get("collected") or []), failures=dict(record.get("failures") or {}),
        batch_ids=[p["batch_id"] for p in record["parts"] if p.get("batch_id")], wait_s=wait,
    )  # fmt: skip


def settle(plan: RunPlan) -> Settled:
    """Submit, check, resubmit or collect the run's batches (see the module docstring); waits with ``--wait``."""
    params = plan.params
    record = read_record(plan)
    status = record.get("status") if record is not None else None
    if record is not None and status == "collected" and record.get("run_id") == plan.run_id:
        log.warning("batches of run %s already collected; finishing the run", plan.run_id)  # a resumed finish
        return _finished(record)
    if params.batch_collect_only and status not in OPEN:
        return Settled(pending=idle_summary(plan, record))
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
        record = _new_record(plan, requests)
    _submit(plan, record, requests)
    texts: dict[str, tuple[str, str]] = {}
    deadline = None if params.batch_timeout_s is None else time.monotonic() + params.batch_timeout_s
    while True:
        _refresh(plan, record)
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


def _parts(plan: RunPlan, requests: Mapping[str, JudgeRequest], keys: list[str], rnd: int) -> list[dict[str, Any]]:
    judge: Any = plan.metric.judge
    parts = split((key, request_line(key, judge.batch_body(requests[key]))) for key in keys)
    tag = "" if rnd == 1 else f"r{rnd}-"
    return [{"part": i, "round": rnd, "custom_ids": [k for k, _ in part], "uploading": False, "file_id": None,
             "filename": f"recall-{plan.run_key}-{tag}{i}.jsonl", "batch_id": None, "status": None}
            for i, part in enumerate(parts)]  # fmt: skip


def _new_record(plan: RunPlan, requests: Mapping[str, JudgeRequest]) -> dict[str, Any]:
    judge: Any = plan.metric.judge
    record = {
        "run_key": plan.run_key, "run_id": plan.run_id, "status": "submitting", "submitted_at": now(),
        "submitted_ts": time.time(), "model": judge.model, "endpoint": getattr(judge, "endpoint", None),
        "params": stored_params(plan.params), "batch_fallback": plan.params.batch_fallback,
        "parts": _parts(plan, requests, list(requests), 1),
    }  # fmt: skip
    write_record(plan, record)
    return record


def _resubmit(
    plan: RunPlan, record: dict[str, Any], requests: Mapping[str, JudgeRequest], texts: dict[str, tuple[str, str]]
) -> bool:
    """Every batch ended: submit the lines left unanswered (failed, expired, cancelled, missing) ONCE in new
    batches (round 2, same record). Not with ``--batch-fallback live`` (those lines are judged live). True if
    round 2 was submitted now."""
    if plan.params.batch_fallback == "live" or "resubmitted" in record:
        return False
    _download(plan, record, texts)
    answers, _ = outcomes(record, texts)
    retry = [k for p in record["parts"] for k in p["custom_ids"] if k not in answers and k in requests]
    record["resubmitted"] = len(retry)
    if retry:
        record["parts"].extend(_parts(plan, requests, retry, 2))
    write_record(plan, record)  # round 2 recorded before any upload: a crash is resumed by the rerun's _submit
    if not retry:
        return False
    _submit(plan, record, requests)
    ids = ", ".join(p["batch_id"] for p in record["parts"] if p.get("round") == 2)
    log.warning("resubmitted %d unanswered line(s) once, in batch(es) %s", len(retry), ids)
    return True


def _submit(plan: RunPlan, record: dict[str, Any], requests: Mapping[str, JudgeRequest]) -> None:
    """Upload and create what the record does not have yet, writing the record after each remote step."""
    judge: Any = plan.metric.judge
    todo = [p for p in record["parts"] if not p.get("batch_id")]
    if not todo:
        return

    async def run() -> None:
        client = judge.batch_client()
        for part in todo:
            if not part.get("file_id") and part.get("uploading"):  # uploaded, id lost: find it by name
                part["file_id"] = await client.find_upload(part["filename"])
            if not part.get("file_id"):
                data = b"".join(request_line(k, judge.batch_body(requests[k])) for k in part["custom_ids"])
                part["uploading"] = True
                write_record(plan, record)
                part["file_id"] = await client.upload(part["filename"], data)
                write_record(plan, record)
            metadata = {"recall_bench_run": plan.run_id, "part": str(part["part"]), "round": str(part.get("round", 1))}
            batch = await client.create(part["file_id"], metadata)
            part.update(batch_id=batch["id"], status=batch["status"])
            write_record(plan, record)

    missing = [k for p in todo if not p.get("file_id") for k in p["custom_ids"] if k not in requests]
    if missing:
        raise ConfigError(
            f"the batch record {record_path(plan)} names {len(missing)} row(s) the dataset no longer has; "
            "delete the record to submit afresh"
        )
    plan.scope.run(run())
    record["status"] = "pending"
    write_record(plan, record)
    for part in todo:
        log.warning("submitted batch %s (%d requests)", part["batch_id"], len(part["custom_ids"]))


def _refresh(plan: RunPlan, record: dict[str, Any]) -> None:
    judge: Any = plan.metric.judge

    async def run() -> None:
        client = judge.batch_client()
        for part in record["parts"]:
            if part.get("status") in ACTIVE or part.get("status") is None:
                batch = await client.retrieve(part["batch_id"])
                part.update(
                    status=batch["status"], output_file_id=batch.get("output_file_id"),
                    error_file_id=batch.get("error_file_id"), request_counts=batch.get("request_counts"),
                )  # fmt: skip

    plan.scope.run(run())
    write_record(plan, record)


def pending_summary(plan: RunPlan, record: dict[str, Any], rows: int) -> PendingSummary:
    """What the flow returns for a pending run: its batches, nothing committed."""
    return {
        "status": PENDING, "run_id": plan.run_id, "run_key": plan.run_key, "rows": plan.dataset.num_rows,
        "batched_rows": rows, "record": record_path(plan), "output": plan.params.output_uri,
        "base_url": plan.params.base_url, "submitted_at": record.get("submitted_at"),
        "batches": [{"id": p["batch_id"], "status": p.get("status"), "requests": len(p["custom_ids"]),
                     "round": p.get("round", 1), "counts": p.get("request_counts")} for p in record["parts"]],
    }  # fmt: skip


def idle_summary(plan: RunPlan, record: dict[str, Any] | None) -> IdleSummary:
    """What a ``batch_collect_only`` run returns when these parameters have no pending batches: nothing done."""
    if record is None:
        why = "no batches were submitted for these parameters and this data"
    else:
        why = f"the batches of run {record.get('run_id')} are {record.get('status')}"
    return {"status": IDLE, "run_id": plan.run_id, "run_key": plan.run_key, "record": record_path(plan),
            "reason": f"nothing to collect: {why}"}  # fmt: skip


def _download(plan: RunPlan, record: dict[str, Any], texts: dict[str, tuple[str, str]]) -> None:
    """The ended parts' output and error files not downloaded yet, into ``texts`` (file id -> batch id, text)."""
    judge: Any = plan.metric.judge
    wanted = [(p[kind], p["batch_id"]) for p in record["parts"] for kind in ("output_file_id", "error_file_id")
              if p.get(kind) and p[kind] not in texts]  # fmt: skip

    async def run() -> None:
        client = judge.batch_client()
        for file_id, batch_id in wanted:
            texts[file_id] = (batch_id, await client.content(file_id))

    if wanted:
        plan.scope.run(run())


def _collect(
    plan: RunPlan, record: dict[str, Any], requests: Mapping[str, JudgeRequest], texts: dict[str, tuple[str, str]]
) -> Settled:
    """Every batch ended: parse the outputs into the row cache; the rest are failures (or judged live)."""
    judge: Any = plan.metric.judge
    _download(plan, record, texts)
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
    write_record(plan, record)
    log.warning(
        "collected %d row(s) from %d batch(es) (%s); %d failed line(s)%s", len(collected), len(record["parts"]),
        ", ".join(p["batch_id"] for p in record["parts"]), len(failures),
        " judged live (--batch-fallback live)" if failures and plan.params.batch_fallback == "live" else "",
    )  # fmt: skip
    return _finished(record)
