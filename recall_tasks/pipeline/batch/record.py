"""The record of a ``--batch`` run's batches, ``<output>/_batches/<run key>.json``, what its batches' output files
say (:func:`outcomes`), and what reads it without a run (``recall-bench batch status | collect | cancel``).

Written whole before and after each remote step (see :mod:`recall_tasks.pipeline.batch.settle`), one writer at a
time: read with its version (:func:`read_at`) and written only if that is still the version (:func:`save`,
:mod:`recall_tasks.io.conditional`'s conditional write: S3 ``If-Match``/``If-None-Match``, a local ``flock`` on
``_batches/.lock``); a stale version raises :class:`RecordChanged`, and the caller re-reads and decides. It holds:

- ``run_key``, ``run_id``, ``status`` (``submitting`` -> ``pending`` -> ``collected``, or ``cancelled`` by
  ``recall-bench batch cancel``), ``submitted_at`` (ISO) and ``submitted_ts`` (epoch seconds, for
  ``runs.batch_wait_s``), ``model``, ``endpoint``;
- ``params``: the run's parameters without the batch control fields (never secret: :class:`RunParams` refuses
  credentials in every field), so ``recall-bench batch collect`` can rebuild the run the same ``run --batch``
  command would finish: state, never configuration (the endpoint, key, storage settings and any code come from
  the collecting command, :mod:`recall_tasks.pipeline.batch.command`); ``batch_fallback`` (the submit's, what
  ``batch collect`` does with failed lines unless told otherwise);
- ``parts``: one per batch (``round`` 1, or 2 for the one resubmission of the lines round 1 left unanswered),
  each with its custom ids, input file name (carrying the hash of its bytes), size and id, the claim written
  before its batch is created (``creating``), batch id, last seen status and output/error file ids
  (:mod:`recall_tasks.pipeline.batch.remote`);
- once collected: ``collected_at``, ``collected_ts``, ``collected`` (keys), ``failures`` (key -> message), cost.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from recall_tasks._sync import run_sync
from recall_tasks.config import BATCH_CONTROL_FIELDS, RunParams
from recall_tasks.errors import ConfigError, RecallBenchError
from recall_tasks.io import conditional
from recall_tasks.judges.batch import ACTIVE, OutputLine, parse_output
from recall_tasks.judges.capabilities import batching

log = logging.getLogger(__name__)  # under recall_tasks.pipeline.batch (tests and users filter on it)

#: Statuses of a record whose batches may still be collected.
OPEN = frozenset({"submitting", "pending"})


def record_file(store: Any, run_key: str) -> str:
    path: str = store.path("_batches", f"{run_key}.json")
    return path


class RecordChanged(RecallBenchError):
    """The record was written by someone else since it was read (its version token is stale)."""


class Record(dict[str, Any]):
    """A record's content with the version it was read at (``token``: None for a record not written yet)."""

    token: str | None = None


def _encoded(record: dict[str, Any]) -> bytes:
    return json.dumps(record, indent=1).encode()


def _loaded(data: bytes, token: str) -> Record:
    record = Record(json.loads(data))
    record.token = token
    return record


def read_at(fs: Any, path: str) -> Record | None:
    """The record at ``path`` with the version it was read at, or None."""
    got = conditional.read(fs, path)
    return None if got is None else _loaded(*got)


def save(fs: Any, path: str, record: Record) -> None:
    """Write ``record`` if the stored version is still the one it was read at (none, for a new record) and keep
    the new version on it; :class:`RecordChanged` otherwise (nothing written)."""
    try:
        record.token = conditional.write(fs, path, _encoded(record), record.token)
    except conditional.Conflict:
        raise RecordChanged(f"the batch record {path} was written by another process since it was read") from None


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def stored_params(params: RunParams) -> dict[str, Any]:
    """What the record keeps of the run's parameters: all but how to wait (those are the caller's choice)."""
    return params.model_dump(mode="json", exclude=set(BATCH_CONTROL_FIELDS))


# -- the outputs -------------------------------------------------------------------------------------------


_WHY = {"cancelled": "was cancelled", "failed": "failed", "expired": "expired"}


def outcomes(
    record: dict[str, Any], texts: Mapping[str, tuple[str, str]]
) -> tuple[dict[str, tuple[str, OutputLine]], dict[str, str]]:
    """The answered lines by custom id (batch id, line), and a message per unanswered one naming its last batch
    and line (and, after the resubmission, the first attempt's)."""
    parts = record["parts"]
    known = {k for p in parts for k in p["custom_ids"]}
    answers: dict[str, tuple[str, OutputLine]] = {}
    failures: dict[str, str] = {}
    for rnd in sorted({p.get("round", 1) for p in parts}):
        these = [p for p in parts if p.get("round", 1) == rnd]
        failed: dict[str, str] = {}
        for part in these:
            for file_id in (part.get("output_file_id"), part.get("error_file_id")):
                if not file_id or file_id not in texts:
                    continue
                batch_id, text = texts[file_id]
                lines, problems = parse_output(text)
                for problem in problems:
                    log.warning("batch %s, file %s: %s", batch_id, file_id, problem)
                for key, line in lines.items():
                    if key not in known:
                        log.warning("batch %s, file %s line %d: unknown custom_id %r ignored", batch_id, file_id,
                                    line.line, key)  # fmt: skip
                    elif line.error is not None:
                        failed[key] = f"batch {batch_id} line {line.line} failed: {line.error}"
                    else:
                        answers[key] = (batch_id, line)
        for part in these:
            for n, key in enumerate(part["custom_ids"], 1):
                if key in answers:
                    continue
                why = _WHY.get(part.get("status") or "", "returned no line for this request (a truncated output file?)")
                message = failed.get(key) or f"batch {part['batch_id']} {why} (request {n})"
                first = failures.get(key)
                failures[key] = message if first is None else f"{message} (resubmitted once; first attempt: {first})"
    for key in answers:
        failures.pop(key, None)
    return answers, failures


# -- without a run: recall-bench batch status | collect | cancel ------------------------------------------


def records(fs: Any, root: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record under ``<root>/_batches``, ``(path, record)``, by path."""
    folder = f"{root.rstrip('/')}/_batches"
    if not fs.exists(folder):
        return []
    paths = sorted(p for p in fs.find(folder) if p.endswith(".json"))
    found: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        record = read_at(fs, path)
        if record is not None:
            found.append((path, record))
    return found


def choose_open(
    found: list[tuple[str, dict[str, Any]]], output: str, run_key: str | None
) -> tuple[str, dict[str, Any]]:
    """The one open record ``batch collect``/``cancel`` acts on: ``run_key``'s, or the only open one.

    Raises ConfigError naming what is wrong (no such key, not open, several open and no key given)."""
    if run_key is not None:
        named = [(p, r) for p, r in found if r.get("run_key") == run_key]
        if not named:
            raise ConfigError(f"no batch record for run key {run_key} under {output}/_batches")
        path, record = named[0]
        if record.get("status") not in OPEN:
            raise ConfigError(f"the batches of run key {run_key} are {record.get('status')}, not pending")
        return path, record
    opened = [(p, r) for p, r in found if r.get("status") in OPEN]
    if len(opened) > 1:
        keys = ", ".join(str(r.get("run_key")) for _, r in opened)
        raise ConfigError(f"{len(opened)} runs have pending batches under {output}: name one run key ({keys})")
    if not opened:
        raise LookupError(f"no pending batches under {output}")
    return opened[0]


def cancel(fs: Any, path: str, params: RunParams) -> tuple[Record, list[str]]:
    """Mark the record ``cancelled``, then cancel its batches that may still run at the provider.

    The mark comes first, by compare-and-swap (re-read and marked again if another process wrote in between): a
    waiting run or a collector writing after it finds the record changed, re-reads it and stops, so a cancelled
    record is never resubmitted nor set back to pending. Returns the record and the cancelled batch ids.
    ``params``: the command's (:func:`~recall_tasks.pipeline.batch.command.run_params`: the endpoint and key never
    come from the record). ConfigError if the record is no longer open."""
    from recall_tasks.pipeline.components import make_judge, release_judge

    record = _mark(fs, path, lambda r: r.update(status="cancelled", cancelled_at=now()))
    judge = make_judge(params)
    todo = [p for p in record["parts"] if p.get("batch_id") and (p.get("status") in ACTIVE or p.get("status") is None)]
    seen: dict[str, Any] = {}

    async def run() -> None:
        client = batching(judge).batch_client()
        for part in todo:
            seen[part["batch_id"]] = (await client.cancel(part["batch_id"])).get("status")

    try:
        run_sync(run())
    finally:
        release_judge(judge)

    def statuses(fresh: Record) -> None:
        for part in fresh["parts"]:
            part["status"] = seen.get(part.get("batch_id") or "", part.get("status"))

    return _mark(fs, path, statuses, require_open=False), [p["batch_id"] for p in todo]


def _mark(fs: Any, path: str, change: Callable[[Record], Any], *, require_open: bool = True) -> Record:
    """Read, change and write the record until no other writer came in between (:func:`conditional.update`)."""

    def marked(data: bytes | None) -> bytes:
        record = None if data is None else Record(json.loads(data))
        if record is None or (require_open and record.get("status") not in OPEN):
            status = None if record is None else record.get("status")
            raise ConfigError(f"the batch record {path} is {status or 'gone'}, not pending: nothing cancelled")
        change(record)
        return _encoded(record)

    try:
        return _loaded(*conditional.update(fs, path, marked))
    except conditional.Conflict as exc:
        raise ConfigError(f"the batch record {exc}; try again") from None
