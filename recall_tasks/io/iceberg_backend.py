"""Iceberg tables (``--format iceberg``) as a :class:`~recall_tasks.io.tables.TableBackend`: appends and reads go
to :class:`~recall_tasks.io.iceberg.IcebergTables` (the catalog, one commit per run and table), maintenance is
here: compaction per partition, snapshot expiry, then orphan files (:mod:`~recall_tasks.io.maintenance`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow.dataset as pads

from recall_tasks.io.iceberg import EXPIRED_PROPERTY, IcebergTables
from recall_tasks.io.tables import Rows, TableName


def _partitions_to_rewrite(table: Any) -> list[dict[str, Any]]:
    """The partitions (as field -> value) holding more than one data file; ``[{}]`` for an unpartitioned table."""
    counts: dict[tuple[Any, ...], int] = {}
    names = [f.name for f in table.spec().fields]
    for task in table.scan().plan_files():
        key = tuple(task.file.partition[i] for i in range(len(names)))
        counts[key] = counts.get(key, 0) + 1
    return [dict(zip(names, key, strict=True)) for key, n in counts.items() if n > 1]


@dataclass
class IcebergBackend:
    """The Iceberg tables of one output."""

    tables: IcebergTables

    def append(
        self, table: TableName, rows: Rows | None, *, commit_id: str, key: tuple[str, str], partition: dict[str, str]
    ) -> None:
        """One catalog commit unless a snapshot (or, after expiry, a row with ``key``) carries ``commit_id``;
        ``results`` is partitioned by the columns of ``partition``."""
        if rows is None:
            return
        partition_by = list(partition) if table == "results" else None
        self.tables.append(table, rows, commit_id, partition_by=partition_by, key=key)

    def read(self, table: TableName) -> pads.Dataset | None:
        return self.tables.dataset(table)

    def _compact(self, name: str) -> None:
        from pyiceberg.expressions import AlwaysTrue, And, EqualTo

        table: Any = self.tables.table(name)
        rewrite = _partitions_to_rewrite(table)
        if not rewrite:
            return
        with table.transaction() as tx:  # one commit: it fails (and is retried) if a run committed since the load
            for part in rewrite:
                terms = [EqualTo(term=k, value=v) for k, v in part.items()]
                where = AlwaysTrue() if not terms else terms[0] if len(terms) == 1 else And(*terms)
                rows = table.scan(row_filter=where).to_arrow()
                tx.overwrite(rows, overwrite_filter=where, snapshot_properties={"recall-bench.maintenance": "compact"})

    def _expire(self, name: str, cutoff: dt.datetime) -> None:
        table: Any = self.tables.table(name)
        if EXPIRED_PROPERTY not in table.properties:  # before expiring: a rerun's check then also looks at the rows
            with table.transaction() as tx:
                tx.set_properties({EXPIRED_PROPERTY: "true"})
            table = self.tables.table(name)
        table.maintenance.expire_snapshots().older_than(cutoff).commit()

    def maintain(self, table: TableName, keep_days: float, started: dt.datetime) -> dict[str, Any] | None:
        """Rewrite each partition holding more than one data file into one (one transaction), expire snapshots
        older than ``keep_days``, then delete the orphan files older than that (and than the safety margin)."""
        from recall_tasks.io import maintenance

        loaded: Any = self.tables.table(table)
        if loaded is None:
            return None
        before, snapshots = len(list(loaded.scan().plan_files())), len(loaded.metadata.snapshots)
        maintenance.retrying(f"{table} (compaction)", lambda: self._compact(table))
        expire_before = started - dt.timedelta(days=keep_days)
        maintenance.retrying(f"{table} (snapshot expiry)", lambda: self._expire(table, expire_before))
        loaded = self.tables.table(table)
        files_before = min(expire_before, started - maintenance.SAFETY_MARGIN)
        return {
            "data_files_before": before, "data_files_after": len(list(loaded.scan().plan_files())),
            "versions": f"{snapshots} -> {len(loaded.metadata.snapshots)} snapshots",
            "files_deleted": maintenance.delete_orphans(self.tables.storage, loaded, files_before),
        }  # fmt: skip
