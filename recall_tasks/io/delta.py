"""Delta Lake tables (``--format delta``, the default): one table per name under ``<output>/<name>``.

A run's rows are appended to ``results`` in ONE Delta commit (readers see all of them or none), then its run rows
to ``runs``; new pass-through columns are merged into the table schema. Each append carries a Delta app
transaction (``txn``) named by its commit id, so nothing is appended twice (see :meth:`DeltaBackend.append`).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass
from typing import Any

import pyarrow.dataset as pads

from recall_tasks.io.storage import StorageConfig, delta_storage_options, join_uri
from recall_tasks.io.tables import Rows, TableName, retry_commits

#: logged under ``io.results``, where commits have always been logged (log configurations filter on it)
log = logging.getLogger("recall_tasks.io.results")

#: Delta commits retried after a conflict with another run's commit (fresh snapshot, schema merged again).
COMMIT_ATTEMPTS = 4

#: Delta data files of ~32 MiB: the writer buffers about one file per partition, which bounds commit memory.
TARGET_FILE_BYTES = 32 * 1024 * 1024


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
        self._append(join_uri(self.output_uri, table), rows, commit_id, **extra)

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

        uri = join_uri(self.output_uri, table)
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

        uri = join_uri(self.output_uri, table)
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
