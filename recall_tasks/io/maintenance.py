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

The steps of each format are its backend's ``maintain`` (:mod:`~recall_tasks.io.delta`,
:mod:`~recall_tasks.io.iceberg_backend`; Parquet files are never rewritten); this module holds what they share:
the retention rules, the retried commit (:func:`retrying`) and the orphan clean-up (:func:`delete_orphans`).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from recall_tasks.errors import ConfigError, RecallBenchError
from recall_tasks.io.storage import StorageConfig, filesystem, is_local
from recall_tasks.io.tables import TABLES, TableBackend, retry_commits

log = logging.getLogger(__name__)

#: ``keep_days`` under this is refused without ``allow_short_retention`` (Delta's vacuum check: 7 days)
RETENTION_FLOOR_DAYS = 7.0
#: ``keep_days`` above this (a century) is refused: dates that far back do not exist
MAX_KEEP_DAYS = 36_500.0
#: no file younger than the start of ``maintain`` minus this is ever deleted, whatever ``keep_days``
SAFETY_MARGIN = dt.timedelta(hours=1)
#: a maintenance commit that lost a race with a run's commit is retried this many times in all
COMMIT_ATTEMPTS = 5


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


def retrying(what: str, step: Callable[[], object]) -> None:
    """``step()``, again after each commit conflict (a run committed first), at most :data:`COMMIT_ATTEMPTS`;
    then :class:`MaintenanceConflict`."""

    def give_up(exc: BaseException) -> BaseException:
        return MaintenanceConflict(
            f"maintain gave up on {what} after {COMMIT_ATTEMPTS} commit conflicts with runs committing "
            "at the same time; nothing was lost: run maintain again when no run commits"
        )

    retry_commits(
        what, lambda _: step(), attempts=COMMIT_ATTEMPTS, conflicts=_conflict_types(), give_up=give_up,
        pause_s=0.05, logger=log,
    )  # fmt: skip


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

    stripped = str(fs._strip_protocol(path))
    if is_local(fs):
        return posixpath.normpath(stripped)
    return posixpath.normpath("/" + stripped).lstrip("/")


def _modified(info: dict[str, Any]) -> dt.datetime | None:
    """When a listed file was last written (local ``mtime``, S3 ``LastModified``); None when not said."""
    value = info.get("mtime") or info.get("LastModified") or info.get("created")
    if value is None:
        return None
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromtimestamp(float(value), dt.UTC)
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def delete_orphans(storage: StorageConfig, table: Any, cutoff: dt.datetime) -> int:
    """Delete the files under the table's location that nothing references and that were written before
    ``cutoff``; refuse (:class:`UnsafeOrphanRemoval`, nothing deleted) unless the table's own current metadata
    file is both listed and recognised as referenced."""
    fs, root = filesystem(table.location(), storage)
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


class Output(Protocol):
    """What :func:`maintain` needs of a :class:`~recall_tasks.io.results.ResultStore`."""

    @property
    def backend(self) -> TableBackend: ...


def maintain(store: Output, keep_days: float = 7.0, *, allow_short_retention: bool = False) -> list[dict[str, Any]]:
    """Compact, checkpoint/expire and clean every table of ``store``; one summary row per table found.

    ``keep_days`` under :data:`RETENTION_FLOOR_DAYS` needs ``allow_short_retention`` (see the module doc).
    """
    check_retention(keep_days, allow_short_retention)
    started = dt.datetime.now(dt.UTC)
    rows = []
    for name in TABLES:
        t0 = time.perf_counter()
        done = store.backend.maintain(name, keep_days, started)
        if done is not None:
            rows.append({"table": name, **done, "seconds": round(time.perf_counter() - t0, 2)})
    return rows
