"""A run judged through the OpenAI Batch API (``--batch``): submit the row-cache misses, collect, then finish live.

The run-level logic; the wire format and the calls are :mod:`recall_tasks.judges.batch`.

- **Submit** (:func:`settle`, no record yet): every row the row cache cannot serve becomes a request line
  (``custom_id`` = its row-cache key, body = what the live judge would send), split at 50,000 lines / 200 MB,
  uploaded, and a batch created per part. The record ``<output>/_batches/<run key>.json`` is written before and
  after each remote step: the parts and their custom ids first, then ``uploading`` (the file name), the file id,
  the batch id. A crash between the upload and the batch creation is resumed by the rerun from the recorded file
  id (or, if the id was never recorded, the upload found by its file name): nothing is uploaded twice.
  The run is then **pending**: no commit, not in ``runs``, never a baseline; the flow returns a summary with the
  batch ids and the CLI tells to rerun the same command (the run key, hence the record, ignores the polling
  options).
- **Collect** (the same command again, every batch ended): output lines are parsed by custom_id into the row
  cache, with tolerant parsing and one live repair call per unusable reply (``OpenAIJudge.finish_batch_reply``);
  an unknown custom_id is ignored with a warning. Failed, expired, cancelled or missing lines (a truncated output
  file) are judged live with ``--batch-fallback live``, else they become row errors naming the batch and the line.
- **Finish**: the normal chunk loop runs. :func:`install` puts two thin wrappers on the plan: the row cache hides
  the collected keys and the judge serves them from the row cache, so the rows are recorded with the batch's
  tokens, requests and (half-price) cost instead of as free cache hits, and no live call is made for them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, JudgeConfigError, JudgeError, JudgeResponseError
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse
from recall_tasks.judges.batch import ACTIVE, OutputLine, parse_output, request_line, split
from recall_tasks.metrics.base import Missing
from recall_tasks.pipeline.scoring import _case, metric_fingerprint, request_key, row_cache_key
from recall_tasks.pipeline.steps import RunPlan

log = logging.getLogger(__name__)

#: The status of a run whose batches are not collected yet (returned by the flow, never committed).
PENDING = "batch_pending"


def check_batch(params: RunParams, judge: Judge) -> None:
    """``--batch`` needs the OpenAI judge, fixed contexts, sentence units, the row cache and an endpoint with a
    Batch API (probed: 404 on /batches or /files is refused before anything is uploaded). Raises ConfigError."""
    if params.judge != "openai":
        raise ConfigError("--batch needs --judge openai (the lexical judge makes no calls)")
    if not params.cache:
        raise ConfigError("--batch collects into the row cache: it cannot run with --no-cache")
    if params.units != "sentences":
        raise ConfigError("--batch supports --units sentences only (claim extraction is not batched yet)")
    if params.retriever or params.context_extractor:
        raise ConfigError(
            "--batch needs contexts that are the same at submit and collect time: a run-time --retriever or "
            "--context-extractor is not supported (use --retrieval-uri)"
        )
    client = getattr(judge, "batch_client", None)
    if client is None:
        raise ConfigError("--batch needs a judge with a Batch API client (--judge openai)")

    async def probe() -> None:
        await client().probe()

    run_sync(probe())


# -- the record ------------------------------------------------------------------------------------------


def record_path(plan: RunPlan) -> str:
    return plan.store._path("_batches", f"{plan.run_key}.json")


def read_record(plan: RunPlan) -> dict[str, Any] | None:
    path = record_path(plan)
    fs = plan.store.fs
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def write_record(plan: RunPlan, record: dict[str, Any]) -> None:
    """Written whole (local: temp file and rename; object stores: one PUT)."""
    path = record_path(plan)
    fs = plan.store.fs
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    text = json.dumps(record, indent=1)
    if type(fs).__name__ == "LocalFileSystem":
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    else:
        with fs.open(path, "w") as fh:
            fh.write(text)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


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
    """What :func:`settle` found: ``pending`` (a summary to return) or the keys to serve and the failures."""

    pending: dict[str, Any] | None = None
    collected: set[str] = field(default_factory=set)
    failures: dict[str, str] = field(default_factory=dict)


def settle(plan: RunPlan) -> Settled:
    """Submit, check or collect the run's batches (see the module docstring); waits with ``--wait``."""
    params = plan.params
    record = read_record(plan)
    if record is not None and record.get("status") == "collected" and record.get("run_id") == plan.run_id:
        log.warning("batches of run %s already collected; finishing the run", plan.run_id)  # a resumed finish
        return Settled(collected=set(record.get("collected") or []), failures=dict(record.get("failures") or {}))
    if record is not None and record.get("status") == "collected":
        record = None  # an earlier run's batches: this run starts its own
    requests = misses(plan)
    if record is None:
        if not requests:
            return Settled()
        record = _new_record(plan, requests)
    _submit(plan, record, requests)
    deadline = None if params.batch_timeout_s is None else time.monotonic() + params.batch_timeout_s
    while True:
        _refresh(plan, record)
        if not any(p.get("status") in ACTIVE for p in record["parts"]):
            break
        if not params.batch_wait or (deadline is not None and time.monotonic() >= deadline):
            if params.batch_wait:
                log.warning("--batch-timeout %gs reached; the batches are still running", params.batch_timeout_s)
            return Settled(pending=pending_summary(plan, record, len(requests)))
        time.sleep(params.poll_interval_s if deadline is None else
                   max(0.0, min(params.poll_interval_s, deadline - time.monotonic())))  # fmt: skip
    return _collect(plan, record, requests)


def _new_record(plan: RunPlan, requests: Mapping[str, JudgeRequest]) -> dict[str, Any]:
    judge: Any = plan.metric.judge
    lines = ((key, request_line(key, judge.batch_body(r))) for key, r in requests.items())
    parts = split(lines)
    record = {
        "run_key": plan.run_key, "run_id": plan.run_id, "status": "submitting", "submitted_at": _now(),
        "model": judge.model, "endpoint": getattr(judge, "endpoint", None),
        "parts": [{"part": i, "custom_ids": [k for k, _ in part], "filename": f"recall-{plan.run_key}-{i}.jsonl",
                   "uploading": False, "file_id": None, "batch_id": None, "status": None}
                  for i, part in enumerate(parts)],
    }  # fmt: skip
    write_record(plan, record)
    return record


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
            batch = await client.create(part["file_id"], {"recall_bench_run": plan.run_id, "part": str(part["part"])})
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


def pending_summary(plan: RunPlan, record: dict[str, Any], rows: int) -> dict[str, Any]:
    """What the flow returns for a pending run: its batches, nothing committed."""
    return {
        "status": PENDING, "run_id": plan.run_id, "rows": plan.dataset.num_rows, "batched_rows": rows,
        "record": record_path(plan), "submitted_at": record.get("submitted_at"),
        "batches": [{"id": p["batch_id"], "status": p.get("status"), "requests": len(p["custom_ids"]),
                     "counts": p.get("request_counts")} for p in record["parts"]],
    }  # fmt: skip


def _collect(plan: RunPlan, record: dict[str, Any], requests: Mapping[str, JudgeRequest]) -> Settled:
    """Every batch ended: parse the outputs into the row cache; the rest are failures (or judged live)."""
    judge: Any = plan.metric.judge
    answers: dict[str, tuple[str, OutputLine]] = {}
    failures: dict[str, str] = {}

    async def download() -> dict[str, tuple[str, str]]:
        client = judge.batch_client()
        files: dict[str, tuple[str, str]] = {}
        for part in record["parts"]:
            for kind in ("output_file_id", "error_file_id"):
                if part.get(kind):
                    files[part[kind]] = (part["batch_id"], await client.content(part[kind]))
        return files

    texts = plan.scope.run(download())
    owner = {k: p for p in record["parts"] for k in p["custom_ids"]}
    for file_id, (batch_id, text) in texts.items():
        lines, problems = parse_output(text)
        for problem in problems:
            log.warning("batch %s, file %s: %s", batch_id, file_id, problem)
        for key, line in lines.items():
            if key not in owner:
                log.warning("batch %s, file %s line %d: unknown custom_id %r ignored", batch_id, file_id, line.line,
                            key)  # fmt: skip
            elif line.error is not None:
                failures[key] = f"batch {batch_id} line {line.line} failed: {line.error}"
            else:
                answers[key] = (batch_id, line)
    for key, part in owner.items():
        if key not in answers and key not in failures:
            why = {"cancelled": "was cancelled", "failed": "failed", "expired": "expired"}.get(
                part.get("status") or "", "returned no line for this request (a truncated output file?)"
            )
            failures[key] = f"batch {part['batch_id']} {why} (request {part['custom_ids'].index(key) + 1})"

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
    record.update(status="collected", collected_at=_now(), collected=sorted(collected), failures=failures)
    record["cost_usd"] = sum(r.cost_usd or 0.0 for r in collected.values())
    write_record(plan, record)
    log.warning(
        "collected %d row(s) from %d batch(es) (%s); %d failed line(s)%s", len(collected), len(record["parts"]),
        ", ".join(p["batch_id"] for p in record["parts"]), len(failures),
        " judged live (--batch-fallback live)" if failures and plan.params.batch_fallback == "live" else "",
    )  # fmt: skip
    return Settled(collected=set(collected), failures=failures)


# -- finishing the run ------------------------------------------------------------------------------------


class _HideCollected:
    """The run's row cache without the keys collected from its batches (the judge below serves them)."""

    def __init__(self, inner: Any, collected: set[str]) -> None:
        self.inner = inner
        self.collected = collected

    def get_many(self, keys: list[str]) -> dict[str, JudgeResponse]:
        found: dict[str, JudgeResponse] = self.inner.get_many([k for k in keys if k not in self.collected])
        return found

    def put_many(self, entries: dict[str, JudgeResponse], *, flush: bool = True) -> bool:
        ready: bool = self.inner.put_many({k: v for k, v in entries.items() if k not in self.collected}, flush=flush)
        return ready

    def __getattr__(self, name: str) -> Any:  # flush, close, stored, claims...
        return getattr(self.inner, name)


class BatchServedJudge:
    """The live judge, except for the run's batch rows: collected ones are served from memory (read once from the
    row cache, no call),
    failed ones raise a row error naming the batch and line, unless ``fallback_live``."""

    def __init__(
        self, live: Any, served: dict[str, JudgeResponse], fingerprint: str, settled: Settled, *, fallback_live: bool
    ) -> None:
        self.live = live
        self.served = served
        self.fingerprint = fingerprint
        self.settled = settled
        self.fallback_live = fallback_live

    @property
    def model(self) -> str:
        return str(self.live.model)

    @property
    def prompt_version(self) -> str:
        return str(self.live.prompt_version)

    def config(self) -> dict[str, Any]:
        return dict(self.live.config())

    def __getattr__(self, name: str) -> Any:  # aclose, prices, endpoint...
        return getattr(self.live, name)

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        key = request_key(self.fingerprint, request)
        served = self.served.get(key)
        if served is not None:
            return served
        failure = self.settled.failures.get(key)
        if failure is not None and not self.fallback_live:
            raise JudgeResponseError(failure, model=self.model)
        response: JudgeResponse = await self.live.judge(request)
        return response


def install(plan: RunPlan, settled: Settled) -> None:
    """Serve the collected rows from the row cache through the judge (see the module docstring)."""
    if plan.cache is None or not (settled.collected or settled.failures):
        return
    fingerprint = metric_fingerprint(plan.metric)
    real = plan.cache
    served = real.get_many(sorted(settled.collected))  # one read per row group, not one per row (~1-2 KB per row)
    plan.metric.judge = BatchServedJudge(
        plan.metric.judge, served, fingerprint, settled, fallback_live=plan.params.batch_fallback == "live"
    )
    plan.cache = _HideCollected(real, settled.collected)  # type: ignore[assignment]
