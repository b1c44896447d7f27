"""Plain Parquet tables (``--format parquet``): Hive-partitioned files under ``<output>/<table>/``.

- ``results/dataset=<d>/run_date=<day>/<run id>-part-<n>.parquet``: a run's rows, in files of
  :data:`~recall_tasks.io.tables.BATCH_ROWS` rows;
- ``runs/dataset=<d>/<run id>.parquet``: written last, it is the run's commit marker: :meth:`ParquetBackend.read`
  of ``results`` only returns rows of runs listed in ``runs``;
- ``comparisons/`` and ``calibrations/``: ``dataset=<d>/<id>.parquet``, each written whole.

Files are written atomically and never rewritten: there is nothing to maintain.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from recall_tasks.io.cache import write_atomically
from recall_tasks.io.schemas import ID_RESULT_FIELDS, LABEL_FIELD, LATE_RESULT_FIELDS, RESULT_FIELDS
from recall_tasks.io.tables import Rows, TableName, row_groups

#: ``results`` columns added after the table's first release (``schemas.LATE_RESULT_FIELDS``)
LATE_FIELDS = [f for f in [*RESULT_FIELDS, LABEL_FIELD, *ID_RESULT_FIELDS] if f.name in LATE_RESULT_FIELDS]


@dataclass
class ParquetBackend:
    """The Parquet tables of one output: ``fs`` and ``root`` are the output's filesystem and path on it."""

    fs: Any
    root: str

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def append(
        self, table: TableName, rows: Rows | None, *, commit_id: str, key: tuple[str, str], partition: dict[str, str]
    ) -> None:
        """Write ``rows()`` into the partition's folder (the partition columns are the folders, not stored in the
        files): ``results`` in files ``<key>-part-<n>.parquet``, other tables in one file ``<key>.parquet``."""
        folder = self._path(table, *(f"{k}={v}" for k, v in partition.items()))
        self.fs.makedirs(folder, exist_ok=True)
        if rows is None:
            return
        data = rows()
        if table != "results":
            whole = data if isinstance(data, pa.Table) else data.read_all()
            write_atomically(self.fs, f"{folder}/{key[1]}.parquet", whole.drop_columns(list(partition)))
            return
        batches = data.to_batches() if isinstance(data, pa.Table) else data
        for index, group in enumerate(row_groups(batches, data.schema)):
            part = f"{folder}/{key[1]}-part-{index:05d}.parquet"
            write_atomically(self.fs, part, group.drop_columns(list(partition)))

    def read(self, table: TableName) -> pads.Dataset | None:
        path = self._path(table)
        if not self.fs.exists(path):
            return None
        ds = pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive")
        late = [f for f in LATE_FIELDS if f.name not in ds.schema.names] if table == "results" else []
        if late:
            # the schema is the first file's: one written before a late column existed still shows the column
            # (null in its rows, the values in later files)
            schema = pa.schema([*ds.schema, *late])
            ds = pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive", schema=schema)
        if table != "results":  # small tables whose files span versions: every file's columns
            schemas = [fragment.physical_schema for fragment in ds.get_fragments()]
            unified = pa.unify_schemas([*schemas, ds.schema], promote_options="permissive")
            return pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive", schema=unified)
        committed = self.read("runs")
        ids = [] if committed is None else committed.to_table(columns=["run_id"]).column(0).to_pylist()
        return ds.filter(pads.field("run_id").isin(pa.array(ids, pa.string())))

    def maintain(self, table: TableName, keep_days: float, started: dt.datetime) -> dict[str, Any] | None:
        return None  # files are never rewritten
