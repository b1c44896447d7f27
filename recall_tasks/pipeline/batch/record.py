"""The record of a ``--batch`` run's batches, ``<output>/_batches/<run key>.json``, what its batches' output files
say (:func:`outcomes`), and what reads it without a run (``recall-bench batch status | collect | cancel``).

Written whole before and after each remote step (see :mod:`recall_tasks.pipeline.batch.settle`). It holds:

- ``run_key``, ``run_id``, ``status`` (``submitting`` -> ``pending`` -> ``collected``, or ``cancelled`` by
  ``recall-bench batch cancel``), ``submitted_at`` (ISO) and ``submitted_ts`` (epoch seconds, for
  ``runs.batch_wait_s``), ``model``, ``endpoint``;
- ``params``: the run's parameters without the batch control fields (never secret: :class:`RunParams` refuses
  credentials in every field), so ``recall-bench batch collect`` can rebuild the run the same ``run --batch``
  command would finish: state, never configuration (the endpoint, key, storage settings and any code come from
  the collecting command, :mod:`recall_tasks.pipeline.batch.command`); ``batch_fallback`` (the submit's, what
  ``batch collect`` does with failed lines unless told otherwise);
- ``parts``: one per batch (``round`` 1, or 2 for the one resubmission of the lines round 1 left unanswered),
  each with its custom ids, input file name and id, batch id, last seen status and output/error file ids;
- once collected: ``collected_at``, ``collected_ts``, ``collected`` (keys), ``failures`` (key -> message), cost.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

from recall_tasks._sync import run_sync
from recall_tasks.config import BATCH_CONTROL_FIELDS, RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.judges.batch import ACTIVE, OutputLine, parse_output

log = logging.getLogger(__name__)  # under recall_tasks.pipeline.batch (tests and users filter on it)

#: Statuses of a record whose batches may still be collected.
OPEN = frozenset({"submitting", "pending"})


def record_file(store: Any, run_key: str) -> str:
    path: str = store._path("_batches", f"{run_key}.json")
    return path


def read_at(fs: Any, path: str) -> dict[str, Any] | None:
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def write_at(fs: Any, path: str, record: dict[str, Any]) -> None:
    """Written whole (local: temp file and rename; object stores: one PUT)."""
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
    found = []
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


def cancel(fs: Any, path: str, record: dict[str, Any], params: RunParams) -> list[str]:
    """Cancel the record's batches that may still run at the provider, then mark the record ``cancelled``.

    Returns the cancelled batch ids. ``params``: the command's (:func:`~recall_tasks.pipeline.batch.command.run_params`:
    the endpoint and key never come from the record)."""
    from recall_tasks.pipeline.components import make_judge, release_judge

    judge: Any = make_judge(params)
    todo = [p for p in record["parts"] if p.get("batch_id") and (p.get("status") in ACTIVE or p.get("status") is None)]

    async def run() -> None:
        client = judge.batch_client()
        for part in todo:
            batch = await client.cancel(part["batch_id"])
            part["status"] = batch.get("status")
            write_at(fs, path, record)

    try:
        run_sync(run())
    finally:
        release_judge(judge)
    record.update(status="cancelled", cancelled_at=now())
    write_at(fs, path, record)
    return [p["batch_id"] for p in todo]
