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

Safe while no run commits: a run committing during maintenance either lands first (maintenance then fails on its
commit and can be run again) or retries on the new version (Delta, and Iceberg's retry with the commit-id check).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from recall_tasks.io.storage import delta_storage_options, join_uri

TABLES = ("results", "runs", "comparisons")


def _delta(store: Any, name: str, keep_days: float) -> dict[str, Any] | None:
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
    table.optimize.compact(target_size=TARGET_FILE_BYTES, writer_properties=_writer_properties())
    table = DeltaTable(uri, storage_options=options)
    table.create_checkpoint()
    table.cleanup_metadata()
    removed = table.vacuum(
        retention_hours=round(keep_days * 24), dry_run=False, enforce_retention_duration=False
    )  # fmt: skip
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


def _delete_orphans(store: Any, table: Any, cutoff: dt.datetime) -> int:
    from recall_tasks.io.storage import filesystem, split_uri

    fs, root = filesystem(table.location(), store.storage)
    referenced = {split_uri(path)[1] for path in _referenced(table)}
    deleted = 0
    for path, info in fs.find(root, detail=True).items():
        modified = info.get("mtime") or info.get("LastModified") or info.get("created")
        when = modified if isinstance(modified, dt.datetime) else dt.datetime.fromtimestamp(float(modified), dt.UTC)
        when = when if when.tzinfo else when.replace(tzinfo=dt.UTC)
        if split_uri(path)[1] not in referenced and when < cutoff:
            fs.rm(path)
            deleted += 1
    return deleted


def _iceberg(store: Any, name: str, keep_days: float) -> dict[str, Any] | None:
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo

    table = store.iceberg.table(name)
    if table is None:
        return None
    before, snapshots = len(list(table.scan().plan_files())), len(table.metadata.snapshots)
    rewrite = _partitions_to_rewrite(table)
    if rewrite:
        with table.transaction() as tx:
            for part in rewrite:
                terms = [EqualTo(term=k, value=v) for k, v in part.items()]
                where = AlwaysTrue() if not terms else terms[0] if len(terms) == 1 else And(*terms)
                rows = table.scan(row_filter=where).to_arrow()
                tx.overwrite(rows, overwrite_filter=where, snapshot_properties={"recall-bench.maintenance": "compact"})
        table = store.iceberg.table(name)
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=keep_days)
    from recall_tasks.io.iceberg import EXPIRED_PROPERTY

    if EXPIRED_PROPERTY not in table.properties:  # before expiring: a rerun's check then also looks at the rows
        with table.transaction() as tx:
            tx.set_properties({EXPIRED_PROPERTY: "true"})
        table = store.iceberg.table(name)
    table.maintenance.expire_snapshots().older_than(cutoff).commit()
    table = store.iceberg.table(name)
    return {
        "data_files_before": before, "data_files_after": len(list(table.scan().plan_files())),
        "versions": f"{snapshots} -> {len(table.metadata.snapshots)} snapshots",
        "files_deleted": _delete_orphans(store, table, cutoff),
    }  # fmt: skip


def maintain(store: Any, keep_days: float = 7.0) -> list[dict[str, Any]]:
    """Compact, checkpoint/expire and clean every table of ``store``; one summary row per table found."""
    rows = []
    for name in TABLES:
        t0 = time.perf_counter()
        if store.format == "delta":
            done = _delta(store, name, keep_days)
        elif store.format == "iceberg":
            done = _iceberg(store, name, keep_days)
        else:
            done = None
        if done is not None:
            rows.append({"table": name, **done, "seconds": round(time.perf_counter() - t0, 2)})
    return rows
