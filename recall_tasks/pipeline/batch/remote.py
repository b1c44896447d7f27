"""The remote steps of a ``--batch`` run, each written to the record around it by compare-and-swap (:mod:`.record`).

- **Parts** (:func:`parts`): a part's input file name carries the SHA-256 of its bytes
  (``recall-<run key>-[r2-]<part>-<sha16>.jsonl``), recorded with its size: an upload whose id was lost is found by
  that name and size, whatever order the provider lists files in, never another run's file.
- **Submit** (:func:`submit`): ``uploading`` is written before the upload, the file id right after it and before
  the batch is created; a claim (``creating``: who, when) is written before ``POST /batches``. A part found with a
  claim but no batch id (a crash, or another process creating it now) is first looked up by its metadata (run
  key, run id, part, round); a fresh claim of another process that is not found yet stops this run
  (:class:`Busy`), an old one is taken over. A batch created while another process wrote the record is cancelled
  at once (it would be paid twice).
- **Refresh** (:func:`refresh`) writes only when a status changed; **download** fetches the ended parts' files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from recall_tasks.errors import ConfigError
from recall_tasks.io.storage import join_uri
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.batch import ACTIVE, request_line, split
from recall_tasks.judges.capabilities import batching
from recall_tasks.pipeline.batch.record import Record, RecordChanged, read_at, record_file, save
from recall_tasks.pipeline.run import RunPlan

log = logging.getLogger("recall_tasks.pipeline.batch.settle")  # one logger for the run's batch steps

#: A claim to create a part's batch younger than this is another process at work (POST /batches takes seconds).
CLAIM_S = 300.0


class Busy(RecordChanged):
    """Another process is creating one of the record's batches right now."""


def record_path(plan: RunPlan) -> str:
    return record_file(plan.store, plan.run_key)


def record_uri(plan: RunPlan) -> str:
    """The record as people name it: with the output's protocol (``s3://…``), unlike the fsspec path."""
    return join_uri(plan.store.output_uri, "_batches", f"{plan.run_key}.json")


def read_record(plan: RunPlan) -> Record | None:
    return read_at(plan.store.fs, record_path(plan))


def write_record(plan: RunPlan, record: dict[str, Any]) -> None:
    """Compare-and-swap over the version the record was read at; RecordChanged if another process wrote it."""
    assert isinstance(record, Record)
    save(plan.store.fs, record_path(plan), record)


def unchanged(plan: RunPlan, record: Record) -> None:
    """Re-read before writing again (a waiting run): RecordChanged if another process wrote the record since."""
    fresh = read_record(plan)
    if fresh is None or fresh.token != record.token:
        raise RecordChanged(f"the batch record {record_uri(plan)} was written by another process")


def _input(plan: RunPlan, requests: Mapping[str, JudgeRequest], keys: list[str]) -> bytes:
    judge = batching(plan.metric.judge)
    return b"".join(request_line(k, judge.batch_body(requests[k])) for k in keys)


def parts(plan: RunPlan, requests: Mapping[str, JudgeRequest], keys: list[str], rnd: int) -> list[dict[str, Any]]:
    """The record's parts for ``keys`` (round ``rnd``), each named by the hash of its input file's bytes."""
    judge = batching(plan.metric.judge)
    cut = split((key, request_line(key, judge.batch_body(requests[key]))) for key in keys)
    tag = "" if rnd == 1 else f"r{rnd}-"
    out = []
    for i, part in enumerate(cut):
        data = b"".join(line for _, line in part)
        digest = hashlib.sha256(data).hexdigest()[:16]
        out.append({"part": i, "round": rnd, "custom_ids": [k for k, _ in part], "uploading": False,
                    "file_id": None, "filename": f"recall-{plan.run_key}-{tag}{i}-{digest}.jsonl",
                    "bytes": len(data), "batch_id": None, "status": None})  # fmt: skip
    return out


def metadata(plan: RunPlan, part: dict[str, Any]) -> dict[str, str]:
    """What a part's batch is created with, and found again by."""
    return {"recall_bench_key": plan.run_key, "recall_bench_run": plan.run_id, "part": str(part["part"]),
            "round": str(part.get("round", 1))}  # fmt: skip


def submit(plan: RunPlan, record: Record, requests: Mapping[str, JudgeRequest]) -> None:
    """Upload and create what the record does not have yet (see the module docstring)."""
    judge = batching(plan.metric.judge)
    todo = [p for p in record["parts"] if not p.get("batch_id")]
    if not todo:
        return
    me = secrets.token_hex(6)
    since = record.get("submitted_ts")

    async def run() -> None:
        client = judge.batch_client()
        for part in todo:
            resumed = bool(part.get("file_id") or part.get("uploading") or part.get("creating"))
            if not part.get("file_id") and part.get("uploading"):  # uploaded, id lost: found by name and size
                part["file_id"] = await client.find_upload(part["filename"], part.get("bytes"))
            if not part.get("file_id"):
                part["uploading"] = True
                write_record(plan, record)
                part["file_id"] = await client.upload(part["filename"], _input(plan, requests, part["custom_ids"]))
                write_record(plan, record)  # the file id, before the batch is created
            meta = metadata(plan, part)
            if resumed:  # a create may have been sent (a crash, or another process now): look for it first
                found = await client.find_batch(meta, since)
                if found is not None:
                    part.update(batch_id=found["id"], creating=None, **_seen(found))
                    write_record(plan, record)
                    continue
                claim = part.get("creating") or {}
                if claim and time.time() - float(claim.get("at", 0)) < CLAIM_S:
                    raise Busy(
                        f"another process is creating batch part {part['part']} of {record_uri(plan)} (or one "
                        f"stopped less than {CLAIM_S:.0f} s ago): rerun later"
                    )
            part["creating"] = {"by": me, "at": time.time()}
            write_record(plan, record)  # the claim: a process that read the record before cannot write any more
            try:
                batch = await client.create(part["file_id"], meta, since)
            except Exception:  # an answered error (looked up by metadata first): no batch, the claim goes
                part["creating"] = None
                with contextlib.suppress(RecordChanged):
                    write_record(plan, record)
                raise
            part.update(batch_id=batch["id"], creating=None, **_seen(batch))
            try:
                write_record(plan, record)
            except RecordChanged:  # another process took the record meanwhile: this batch would be paid twice
                log.warning("batch %s was created while another process wrote the record: cancelling it", batch["id"])
                await client.cancel(batch["id"])
                raise

    missing = [k for p in todo if not p.get("file_id") for k in p["custom_ids"] if k not in requests]
    if missing:
        raise ConfigError(
            f"the batch record {record_uri(plan)} names {len(missing)} row(s) the dataset no longer has; "
            "delete the record to submit afresh"
        )
    plan.scope.run(run())
    record["status"] = "pending"
    write_record(plan, record)
    for part in todo:
        log.info("submitted batch %s (%d requests)", part["batch_id"], len(part["custom_ids"]))


def _seen(batch: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of a batch object (a batch found by its metadata may have ended already)."""
    return {"status": batch["status"], "output_file_id": batch.get("output_file_id"),
            "error_file_id": batch.get("error_file_id"), "request_counts": batch.get("request_counts")}  # fmt: skip


def refresh(plan: RunPlan, record: Record) -> None:
    """The parts' statuses at the provider; the record is written only when one changed."""
    judge = batching(plan.metric.judge)

    async def run() -> bool:
        client = judge.batch_client()
        changed = False
        for part in record["parts"]:
            if part.get("status") in ACTIVE or part.get("status") is None:
                seen = _seen(await client.retrieve(part["batch_id"]))
                changed |= any(part.get(k) != v for k, v in seen.items())
                part.update(seen)
        return changed

    if plan.scope.run(run()):
        write_record(plan, record)


def download(plan: RunPlan, record: dict[str, Any], texts: dict[str, tuple[str, str]]) -> None:
    """The ended parts' output and error files not downloaded yet, into ``texts`` (file id -> batch id, text)."""
    judge = batching(plan.metric.judge)
    wanted = [(p[kind], p["batch_id"]) for p in record["parts"] for kind in ("output_file_id", "error_file_id")
              if p.get(kind) and p[kind] not in texts]  # fmt: skip

    async def run() -> None:
        client = judge.batch_client()
        for file_id, batch_id in wanted:
            texts[file_id] = (batch_id, await client.content(file_id))

    if wanted:
        plan.scope.run(run())
