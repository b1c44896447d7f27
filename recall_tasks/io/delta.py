"""Delta Lake tables (``--format delta``, the default): one table per name under ``<output>/<name>``.

A run's rows are appended to ``results`` in ONE Delta commit (readers see all of them or none), then its run rows
to ``runs``; new pass-through columns are merged into the table schema. Each append carries a Delta app
transaction (``txn``) named by its commit id, so nothing is appended twice (see :meth:`DeltaBackend.append`).

Where the tables are, as deltalake (1.6) is given it (:func:`table_location`), and the outputs it cannot take
(:func:`location_problem`; a run or calibration is refused before it judges anything:
:func:`~recall_tasks.pipeline.checks.check_output_name`). deltalake reads a location as a URL and builds another
from it; found by writing to such folders:

* a local output is handed over as its plain path (a ``file://`` output too: as a URL, its ``?`` or ``#`` would end
  the path and its escapes be decoded). ``[ ] ^ |`` in it make deltalake panic at the commit (an invalid internal
  URL), ``\\`` is taken for ``/``, a ``%`` escape (``%20``, ``%2F``) is decoded, so the tables would go to another
  folder (``recall v2``), a control character is refused: all refused. ``? # % { } é`` and spaces work.
* an object-store output (``s3://``; ``gs://`` and ``az://`` go through the same URL parsing) is handed over with its
  key percent-encoded (the same object keys for every character that worked as it was): raw, ``?`` and ``#`` cut the
  key (``night?v2`` wrote to ``night``) and ``[ ] ^ |`` made deltalake panic; encoded, they work. A ``%`` escape
  (decoded twice: ``%2520`` ends as ``' '``), ``\\`` and control characters do not: refused.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pyarrow.dataset as pads

from recall_tasks.errors import ConfigError
from recall_tasks.io.storage import StorageConfig, delta_storage_options, join_uri, split_uri
from recall_tasks.io.tables import Rows, TableName, retry_commits

#: logged under ``io.results``, where commits have always been logged (log configurations filter on it)
log = logging.getLogger("recall_tasks.io.results")

#: Delta commits retried after a conflict with another run's commit (fresh snapshot, schema merged again).
COMMIT_ATTEMPTS = 4

#: Delta data files of ~32 MiB: the writer buffers about one file per partition, which bounds commit memory.
TARGET_FILE_BYTES = 32 * 1024 * 1024


#: what deltalake cannot have in a location, by kind of output: characters and ``%`` escapes (the module doc)
_ESCAPE = r"%[0-9A-Fa-f]{2}"
_CONTROL = r"[\x00-\x1f\x7f]"
_REFUSED = {
    "local": re.compile(rf"{_ESCAPE}|{_CONTROL}|[\[\]^|\\]"),
    "store": re.compile(rf"{_ESCAPE}|{_CONTROL}|\\"),
}


@dataclass(frozen=True)
class LocationProblem:
    """Why deltalake cannot keep tables under an output: what it holds that deltalake cannot take, and a name."""

    uri: str
    found: tuple[str, ...]  # the characters and escapes, in order of first appearance
    suggestion: str  # the location with each run of them (and the spaces around) made one ``_``

    def message(self) -> str:
        held = _described(self.found)
        return (
            f"--output {_printable(self.uri)}: Delta tables cannot be kept under a path holding {held}; rename it, "
            f"e.g. --output {shlex.quote(self.suggestion)}, or choose --format parquet or iceberg"
        )


def _shown(text: str) -> str:
    return repr(text) if re.fullmatch(_CONTROL, text) else f"'{text}'"


def _why(items: list[str]) -> str:
    """Why deltalake cannot take ``items`` (of one kind: the first one's)."""
    it, found = "them" if len(items) > 1 else "it", items[0]
    if re.fullmatch(_CONTROL, found):
        return "deltalake refuses control characters"
    if found == "\\":
        return "deltalake takes it for '/'"
    if found.startswith("%"):
        codes = [int(item[1:], 16) for item in items]
        decoded = [_shown(chr(c)) if c < 0x80 else f"the byte 0x{c:02X}" for c in codes]
        return f"deltalake decodes {it} to {_listed(decoded)}: the tables would go to another folder"
    return f"deltalake fails on {it} at the commit, after the rows are judged"


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _kind(found: str) -> str:
    if re.fullmatch(_CONTROL, found):
        return "control"
    return {"%": "escape", "\\": "backslash"}.get(found[0], "fails")


def _described(found: tuple[str, ...]) -> str:
    """``'[' and ']' (deltalake fails on them at the commit, ...), '%20' (...)``: the findings grouped by kind."""
    groups: dict[str, list[str]] = {}
    for item in found:
        groups.setdefault(_kind(item), []).append(item)
    return ", ".join(f"{_listed([_shown(i) for i in items])} ({_why(items)})" for items in groups.values())


def _printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\t``): an error stays one line."""
    return re.sub(_CONTROL, lambda m: repr(m.group(0))[1:-1], text)


def location_problem(output_uri: str) -> LocationProblem | None:
    """What in ``output_uri`` deltalake cannot take (the module doc), or None when it can keep tables there."""
    protocol, path = split_uri(output_uri)
    if protocol == "file":
        head, key, refused = "", path, _REFUSED["local"]
    else:
        scheme, rest = output_uri.split("://", 1)
        bucket, _, key = rest.partition("/")
        head, refused = f"{scheme}://{bucket}/", _REFUSED["store"]
    found = tuple(dict.fromkeys(m.group(0) for m in refused.finditer(key)))
    if not found:
        return None
    run = re.compile(rf" *(?:(?:{refused.pattern}) *)+")

    def renamed(segment: str) -> str:
        named = run.sub(lambda m: "" if m.start() == 0 or m.end() == len(segment) else "_", segment)
        return named or "_"

    suggestion = head + "/".join(renamed(s) if refused.search(s) else s for s in key.split("/"))
    return LocationProblem(output_uri, found, suggestion)


def check_location(output_uri: str) -> None:
    """Refuse an output deltalake cannot keep tables under (one :class:`ConfigError` naming what and a new name)."""
    problem = location_problem(output_uri)
    if problem is not None:
        raise ConfigError(problem.message())


def table_location(output_uri: str, table: str) -> str:
    """Where table ``table`` of ``output_uri`` is, as deltalake is given it: a local output's plain path, an
    object-store output's URL with its key percent-encoded (the module doc)."""
    protocol, path = split_uri(output_uri)
    if protocol == "file":
        return join_uri(path, table)
    scheme, rest = join_uri(output_uri, table).split("://", 1)
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}/{quote(key, safe='/')}"


def writer_properties() -> Any:
    from deltalake import WriterProperties

    return WriterProperties(compression="ZSTD", max_row_group_size=64 * 1024)


@dataclass
class DeltaBackend:
    """The Delta tables of one output."""

    output_uri: str
    storage: StorageConfig

    def append(
        self, table: TableName, rows: Rows | None, *, commit_id: str, key: tuple[str, str], partition: dict[str, str]
    ) -> None:
        """Append once per ``commit_id``: a Delta app transaction (``txn``) is recorded in the same commit.

        The check and the write use ONE snapshot of the table (created empty first if missing): a commit that
        lands after that snapshot with the same app id makes ours fail ("concurrent transaction"), and we then
        find the winner's id and skip. So a rerun and two processes committing the same run at once both end
        with the rows once, without scanning the table. A conflict with ANOTHER run's commit (two datasets with
        different pass-through columns merging the schema at the same moment: "Metadata changed since last
        commit") is retried on a fresh snapshot, up to :data:`COMMIT_ATTEMPTS` times. ``rows`` is called again
        for each attempt, since a streamed reader can be written only once. ``results`` is partitioned by the
        columns of ``partition``, in files of about :data:`TARGET_FILE_BYTES`.
        """
        if rows is None:
            return
        extra: dict[str, Any] = {}
        if table == "results":
            extra = {"partition_by": list(partition), "target_file_size": TARGET_FILE_BYTES,
                     "writer_properties": writer_properties()}  # fmt: skip
        self._append(table_location(self.output_uri, table), rows, commit_id, **extra)

    def _append(self, uri: str, rows: Rows, app_id: str, **kwargs: Any) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.exceptions import CommitFailedError, TableNotFoundError

        options = delta_storage_options(self.output_uri, self.storage)
        schema = rows().schema
        try:
            table = DeltaTable(uri, storage_options=options)
        except TableNotFoundError:
            try:
                table = DeltaTable.create(
                    uri, schema, mode="ignore", partition_by=kwargs.get("partition_by"), storage_options=options
                )
            except CommitFailedError:  # created by a concurrent writer
                table = DeltaTable(uri, storage_options=options)
        if table.transaction_version(app_id) is not None:
            return
        props = CommitProperties(app_transactions=[Transaction(app_id=app_id, version=1)])

        def attempt(_: int) -> None:
            import deltalake  # looked up at each call: tests hold two writers at the same snapshot through it

            # a reader is streamed once: each attempt gets a fresh one (memory stays bounded)
            deltalake.write_deltalake(
                table, rows(), mode="append", schema_mode="merge", commit_properties=props, **kwargs
            )

        def landed() -> bool:
            nonlocal table
            table = DeltaTable(uri, storage_options=options)  # a fresh snapshot
            if table.transaction_version(app_id) is None:
                return False  # another run committed first (e.g. a schema merge of its own pass-through columns)
            log.info("%s was committed by a concurrent writer; not appended again", app_id)
            return True

        retry_commits(
            app_id, attempt, attempts=COMMIT_ATTEMPTS, conflicts=(CommitFailedError,), landed=landed, logger=log
        )

    def read(self, table: TableName) -> pads.Dataset | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        uri = table_location(self.output_uri, table)
        try:
            options = delta_storage_options(uri, self.storage)
            return DeltaTable(uri, storage_options=options).to_pyarrow_dataset()
        except TableNotFoundError:
            return None

    def maintain(self, table: TableName, keep_days: float, started: dt.datetime) -> dict[str, Any] | None:
        """Compact small files into ~32 MiB ones (one commit, retried on conflict), write a checkpoint, drop log
        files past the log retention and vacuum data files no version of the last ``keep_days`` references."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        from recall_tasks.io import maintenance

        uri = table_location(self.output_uri, table)
        options = delta_storage_options(uri, self.storage)
        try:
            delta = DeltaTable(uri, storage_options=options)
        except TableNotFoundError:
            return None
        before, version = len(delta.file_uris()), delta.version()

        def compact() -> None:
            fresh = DeltaTable(uri, storage_options=options)
            fresh.optimize.compact(target_size=TARGET_FILE_BYTES, writer_properties=writer_properties())

        maintenance.retrying(f"{uri} (compaction)", compact)
        delta = DeltaTable(uri, storage_options=options)
        delta.create_checkpoint()
        delta.cleanup_metadata()
        # vacuum deletes removed files older than the retention AND files no log entry mentions (a committing
        # run's new data file): the retention reaches back to the start of maintain minus the margin, at least
        floor = dt.datetime.now(dt.UTC) - (started - maintenance.SAFETY_MARGIN)
        hours = max(math.ceil(keep_days * 24), math.ceil(floor.total_seconds() / 3600))
        removed = delta.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
        return {
            "data_files_before": before, "data_files_after": len(delta.file_uris()),
            "versions": f"{version} -> {delta.version()} (checkpoint)", "files_deleted": len(removed),
        }  # fmt: skip
