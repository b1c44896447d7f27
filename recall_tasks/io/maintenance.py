"""Maintenance of long-lived result tables (``recall-bench maintain``): a year of nights stays fast.

Every night adds small data files and one commit per table. Maintenance, per table:

* **Delta**: compact small files into ~32 MiB ones (``optimize.compact``, one commit), write a checkpoint (readers
  replay the log from it, not from version 0), drop log files past the log retention (``cleanup_metadata``) and
  vacuum data files no version of the last ``keep_days`` references. App transaction ids (the rerun check) live
  in the checkpoint, so a resumed run still finds its commit.
* **Iceberg**: rewrite each ``results`` partition (and the small tables) that has more than one data file into
  one file (an overwrite per partition, all in one transaction), expire snapshots older than ``keep_days``, then
  delete the files under the table's location that no remaining snapshot or metadata version references and that
  are older than ``keep_days`` (orphans: expired snapshots' manifests and data files). A resumed run's check
  then looks for its run id in the rows too (``io/iceberg.EXPIRED_PROPERTY``), so no rerun appends twice.

Nothing a reader or a committing run needs is ever deleted (decisions, issue 31):

* **A retention floor**: ``keep_days`` under :data:`RETENTION_FLOOR_DAYS` is refused unless the caller says so
  (``allow_short_retention``, the CLI's ``--allow-short-retention``), like Delta's vacuum refuses a retention
  under 7 days without ``enforce_retention_duration=False`` and Iceberg's orphan removal keeps files of the last
  3 days. Even then no file younger than the start of ``maintain`` minus :data:`SAFETY_MARGIN` is deleted: a run
  committing meanwhile writes its data files before its commit references them, and such a file must not be
  taken for an orphan (nor vacuumed by Delta, which deletes unreferenced files too).
* **Orphans are judged by one spelling of each path**: the catalog's references (``s3://``, ``s3a://``,
  ``file://``, plain local paths) and the listing's keys (no scheme) are both reduced to the filesystem's own
  form (:func:`path_key`). Before deleting anything, the table's current metadata file must be among the listed
  files and be referenced: if not (paths spelled in a way this code does not understand, metadata elsewhere),
  nothing is deleted and the table is named in the error.
* **Concurrent commits**: a compaction, expiry or property commit that loses a race with a run's commit is
  retried on the fresh table up to :data:`COMMIT_ATTEMPTS` times, then :class:`MaintenanceConflict` (the CLI's
  one ``error:`` line, exit 4): nothing is lost, maintenance can be run again.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from recall_tasks.errors import ConfigError, RecallBenchError
from recall_tasks.io.storage import delta_storage_options, join_uri

log = logging.getLogger(__name__)

TABLES = ("results", "runs", "comparisons", "calibrations")
#: ``keep_days`` under this is refused without ``allow_short_retention`` (Delta's vacuum check: 7 days)
RETENTION_FLOOR_DAYS = 7.0
#: ``keep_days`` above this (a century) is refused: dates that far back do not exist
MAX_KEEP_DAYS = 36_500.0
#: no file younger than the start of ``maintain`` minus this is ever deleted, whatever ``keep_days``
SAFETY_MARGIN = dt.timedelta(hours=1)
#: a maintenance commit that lost a race with a run's commit is retried this many times in all
COMMIT_ATTEMPTS = 5

T = TypeVar("T")


class MaintenanceConflict(RecallBenchError):
    """Maintenance gave up on a table after :data:`COMMIT_ATTEMPTS` commit conflicts (runs kept committing)."""


class UnsafeOrphanRemoval(RecallBenchError):
    """The orphan clean-up refused to delete: the table's own files would not have been recognised as used."""


def check_retention(keep_days: float, allow_short_retention: bool) -> None:
    """Refuse a ``keep_days`` under the floor unless explicitly allowed (and a negative, infinite or NaN one
    always)."""
    if not math.isfinite(keep_days) or not 0 <= keep_days <= MAX_KEEP_DAYS:
        raise ConfigError(f"--keep-days must be a number of days from 0 to {MAX_KEEP_DAYS:g}, got {keep_days}")
    if keep_days < RETENTION_FLOOR_DAYS and not allow_short_retention:
        raise ConfigError(
            f"--keep-days {keep_days:g} is under the {RETENTION_FLOOR_DAYS:g}-day retention floor: a resumed run's "
            "check and readers of older versions need them; add --allow-short-retention to go lower (files "
            f"younger than {_hours(SAFETY_MARGIN)} before maintain started are still never deleted)"
        )


def _hours(delta: dt.timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:g} hour" + ("" if hours == 1 else "s")


def _conflict_types() -> tuple[type[BaseException], ...]:
    from deltalake.exceptions import CommitFailedError
    from pyiceberg.exceptions import CommitFailedException

    return (CommitFailedError, CommitFailedException)


def _retrying(what: str, step: Callable[[], T]) -> T:
    """``step()``, again after each commit conflict (a run committed first), at most :data:`COMMIT_ATTEMPTS`."""
    conflicts = _conflict_types()
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return step()
        except conflicts as exc:
            if attempt == COMMIT_ATTEMPTS:
                raise MaintenanceConflict(
                    f"maintain gave up on {what} after {COMMIT_ATTEMPTS} commit conflicts with runs committing "
                    "at the same time; nothing was lost: run maintain again when no run commits"
                ) from exc
            log.info("%s: commit conflict (%s); retrying on the new table version", what, exc)
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _delta(store: Any, name: str, keep_days: float, started: dt.datetime) -> dict[str, Any] | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from recall_tasks.io.results import TARGET_FILE_BYTES, _writer_properties

    uri = join_uri(store.output_uri, name)
    options = delta_storage_options(uri, store.storage)
    try:
        table = DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None
    before, version = len(table.file_uris()), table.version()

    def compact() -> None:
        fresh = DeltaTable(uri, storage_options=options)
        fresh.optimize.compact(target_size=TARGET_FILE_BYTES, writer_properties=_writer_properties())

    _retrying(f"{uri} (compaction)", compact)
    table = DeltaTable(uri, storage_options=options)
    table.create_checkpoint()
    table.cleanup_metadata()
    # vacuum deletes removed files older than the retention AND files no log entry mentions (a committing run's
    # new data file): the retention reaches back to the start of maintain minus the margin, at least
    floor = dt.datetime.now(dt.UTC) - (started - SAFETY_MARGIN)
    hours = max(math.ceil(keep_days * 24), math.ceil(floor.total_seconds() / 3600))
    removed = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
    return {
        "data_files_before": before, "data_files_after": len(table.file_uris()),
        "versions": f"{version} -> {table.version()} (checkpoint)", "files_deleted": len(removed),
    }  # fmt: skip


def _partitions_to_rewrite(table: Any) -> list[dict[str, Any]]:
    """The partitions (as field -> value) holding more than one data file; ``[{}]`` for an unpartitioned table."""
    counts: dict[tuple[Any, ...], int] = {}
    names = [f.name for f in table.spec().fields]
    for task in table.scan().plan_files():
        key = tuple(task.file.partition[i] for i in range(len(names)))
        counts[key] = counts.get(key, 0) + 1
    return [dict(zip(names, key, strict=True)) for key, n in counts.items() if n > 1]


def _referenced(table: Any) -> set[str]:
    """Every file the table's remaining snapshots and metadata versions reference."""
    io, meta = table.io, table.metadata
    found = {table.metadata_location, *(entry.metadata_file for entry in meta.metadata_log)}
    for snapshot in meta.snapshots:
        found.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            found.add(manifest.manifest_path)
            found.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=False))
    return found


def path_key(fs: Any, path: str) -> str:
    """``path`` as ``fs`` lists it: ``s3://b/k``, ``s3a://b/k`` and ``b/k`` give ``b/k`` on S3; ``file:///x``,
    ``/x`` and ``/a/../x`` give ``/x`` locally (fsspec's own protocol stripping, then one spelling of the path)."""
    import posixpath

    from fsspec.implementations.local import LocalFileSystem

    stripped = str(fs._strip_protocol(path))
    if isinstance(fs, LocalFileSystem):
        return posixpath.normpath(stripped)
    return posixpath.normpath("/" + stripped).lstrip("/")


def _modified(info: dict[str, Any]) -> dt.datetime | None:
    """When a listed file was last written (local ``mtime``, S3 ``LastModified``); None when not said."""
    value = info.get("mtime") or info.get("LastModified") or info.get("created")
    if value is None:
        return None
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromtimestamp(float(value), dt.UTC)
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _delete_orphans(store: Any, table: Any, cutoff: dt.datetime) -> int:
    """Delete the files under the table's location that nothing references and that were written before
    ``cutoff``; refuse (:class:`UnsafeOrphanRemoval`, nothing deleted) unless the table's own current metadata
    file is both listed and recognised as referenced."""
    from recall_tasks.io.storage import filesystem

    fs, root = filesystem(table.location(), store.storage)
    referenced = {path_key(fs, path) for path in _referenced(table)}
    listed = {path_key(fs, path): (path, info) for path, info in fs.find(root, detail=True).items()}
    current = path_key(fs, table.metadata_location)
    if not referenced or current not in referenced or current not in listed:
        raise UnsafeOrphanRemoval(
            f"orphan clean-up of {table.location()} refused, nothing deleted: its current metadata file "
            f"{table.metadata_location} is not among the {len(listed)} files listed under it"
        )
    deleted = 0
    for key, (path, info) in listed.items():
        when = _modified(info)
        if key in referenced or key == current or when is None or when >= cutoff:
            continue
        fs.rm(path)
        deleted += 1
    return deleted


def _compact_iceberg(store: Any, name: str) -> None:
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo

    table = store.iceberg.table(name)
    rewrite = _partitions_to_rewrite(table)
    if not rewrite:
        return
    with table.transaction() as tx:  # one commit: it fails (and is retried) if a run committed since the load
        for part in rewrite:
            terms = [EqualTo(term=k, value=v) for k, v in part.items()]
            where = AlwaysTrue() if not terms else terms[0] if len(terms) == 1 else And(*terms)
            rows = table.scan(row_filter=where).to_arrow()
            tx.overwrite(rows, overwrite_filter=where, snapshot_properties={"recall-bench.maintenance": "compact"})


def _expire_iceberg(store: Any, name: str, cutoff: dt.datetime) -> None:
    from recall_tasks.io.iceberg import EXPIRED_PROPERTY

    table = store.iceberg.table(name)
    if EXPIRED_PROPERTY not in table.properties:  # before expiring: a rerun's check then also looks at the rows
        with table.transaction() as tx:
            tx.set_properties({EXPIRED_PROPERTY: "true"})
        table = store.iceberg.table(name)
    table.maintenance.expire_snapshots().older_than(cutoff).commit()


def _iceberg(store: Any, name: str, keep_days: float, started: dt.datetime) -> dict[str, Any] | None:
    table = store.iceberg.table(name)
    if table is None:
        return None
    before, snapshots = len(list(table.scan().plan_files())), len(table.metadata.snapshots)
    _retrying(f"{name} (compaction)", lambda: _compact_iceberg(store, name))
    expire_before = started - dt.timedelta(days=keep_days)
    _retrying(f"{name} (snapshot expiry)", lambda: _expire_iceberg(store, name, expire_before))
    table = store.iceberg.table(name)
    files_before = min(expire_before, started - SAFETY_MARGIN)
    return {
        "data_files_before": before, "data_files_after": len(list(table.scan().plan_files())),
        "versions": f"{snapshots} -> {len(table.metadata.snapshots)} snapshots",
        "files_deleted": _delete_orphans(store, table, files_before),
    }  # fmt: skip


def maintain(store: Any, keep_days: float = 7.0, *, allow_short_retention: bool = False) -> list[dict[str, Any]]:
    """Compact, checkpoint/expire and clean every table of ``store``; one summary row per table found.

    ``keep_days`` under :data:`RETENTION_FLOOR_DAYS` needs ``allow_short_retention`` (see the module doc).
    """
    check_retention(keep_days, allow_short_retention)
    started = dt.datetime.now(dt.UTC)
    rows = []
    for name in TABLES:
        t0 = time.perf_counter()
        if store.format == "delta":
            done = _delta(store, name, keep_days, started)
        elif store.format == "iceberg":
            done = _iceberg(store, name, keep_days, started)
        else:
            done = None
        if done is not None:
            rows.append({"table": name, **done, "seconds": round(time.perf_counter() - t0, 2)})
    return rows
