"""Result tables: chunk results staged under the output, then committed all at once.

Layout under ``<output>``:
- ``results/`` per-row results, partitioned by ``dataset`` and ``run_date``;
- ``runs/`` one row per run (``segment_column`` null) plus one per segment value;
- ``_staging/<run_id>/`` chunk parts while a run is in progress (a leading underscore: Spark, Hive, Trino
  and pyarrow dataset discovery ignore it), removed after the commit.

Formats:
- ``delta`` (default): the staged parts are appended to the ``results`` Delta table in ONE commit (readers see
  all of a run's rows or none), then the run rows to ``runs``. Pass-through columns can differ between
  datasets: new columns are merged into the table schema.
- ``parquet``: Hive-partitioned files under ``results/dataset=<d>/run_date=<day>/``; the run's ``runs`` file is
  written last and is the commit marker: a run's rows count only when its run id is in ``runs``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from recall_tasks.errors import StorageError
from recall_tasks.storage import (
    StorageConfig,
    delta_storage_options,
    filesystem,
    join_uri,
    translate_storage_error,
)

Format = Literal["delta", "parquet"]

RUN_FIELDS: list[pa.Field] = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("flow_run_id", pa.string()),
    pa.field("started_at", pa.timestamp("us", tz="UTC")),
    pa.field("finished_at", pa.timestamp("us", tz="UTC")),
    pa.field("dataset", pa.string()),
    pa.field("run_date", pa.string()),
    pa.field("dataset_uri", pa.string()),
    pa.field("dataset_fingerprint", pa.string()),
    pa.field("label", pa.string()),
    pa.field("index_version", pa.string()),
    pa.field("metric", pa.string()),
    pa.field("judge_model", pa.string()),
    pa.field("prompt_version", pa.string()),
    pa.field("threshold", pa.float64()),
    pa.field("scale", pa.float64()),
    pa.field("segment_column", pa.string()),
    pa.field("segment_value", pa.string()),
    pa.field("rows", pa.int64()),
    pa.field("scored", pa.int64()),
    pa.field("errors", pa.int64()),
    pa.field("skipped", pa.int64()),
    pa.field("cached", pa.int64()),
    pa.field("mean_score", pa.float64()),
    pa.field("median_score", pa.float64()),
    pa.field("p10_score", pa.float64()),
    pa.field("ci_low", pa.float64()),
    pa.field("ci_high", pa.float64()),
    pa.field("pass_rate", pa.float64()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("requests", pa.int64()),
    pa.field("cost_usd", pa.float64()),
    pa.field("wall_seconds", pa.float64()),
    pa.field("status", pa.string()),
]
RUN_SCHEMA = pa.schema(RUN_FIELDS)


@dataclass
class ResultStore:
    """Where a run's results go, and how they are staged and committed."""

    output_uri: str
    storage: StorageConfig
    format: Format = "delta"

    def __post_init__(self) -> None:
        if self.format not in ("delta", "parquet"):
            raise ValueError(f"format must be 'delta' or 'parquet', got {self.format!r}")
        self.fs, self.root = filesystem(self.output_uri, self.storage)

    @property
    def results_uri(self) -> str:
        return join_uri(self.output_uri, "results")

    @property
    def runs_uri(self) -> str:
        return join_uri(self.output_uri, "runs")

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def staging_path(self, run_id: str) -> str:
        return self._path("_staging", run_id)

    # -- staging ---------------------------------------------------------------------------------

    def stage(self, run_id: str, seq: int, table: pa.Table) -> str:
        """Write one chunk's results under the run's staging folder (idempotent per ``seq``)."""
        path = f"{self.staging_path(run_id)}/part-{seq:06d}.parquet"
        try:
            self.fs.makedirs(self.staging_path(run_id), exist_ok=True)
            pq.write_table(table, path, filesystem=self.fs, compression="zstd")
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None
        return path

    def staged(self, run_id: str) -> pads.Dataset | None:
        """The staged parts of a run as one dataset (schemas unified), or None."""
        base = self.staging_path(run_id)
        try:
            if not self.fs.exists(base):
                return None
            files = sorted(p for p in self.fs.find(base) if p.endswith(".parquet"))
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None
        if not files:
            return None
        schemas = [pq.read_schema(f, filesystem=self.fs) for f in files[:1]]
        return pads.dataset(files, schema=schemas[0], filesystem=self.fs, format="parquet")

    def discard(self, run_id: str) -> None:
        """Remove a run's staging folder (after commit, or to abandon it)."""
        try:
            if self.fs.exists(self.staging_path(run_id)):
                self.fs.rm(self.staging_path(run_id), recursive=True)
        except Exception:  # noqa: BLE001 - leftover staging is invisible to readers; never fail a run for it
            pass

    # -- commit ----------------------------------------------------------------------------------

    def commit(self, run_id: str, dataset: str, run_date: str, runs: list[dict[str, Any]]) -> None:
        """Make a run's results visible at once, then append its run rows."""
        staged = self.staged(run_id)
        runs_table = pa.Table.from_pylist(runs, schema=RUN_SCHEMA)
        try:
            if self.format == "delta":
                self._commit_delta(staged, dataset, run_date, runs_table)
            else:
                self._commit_parquet(run_id, staged, dataset, run_date, runs_table)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None
        self.discard(run_id)

    def _batches(self, staged: pads.Dataset, dataset: str, run_date: str) -> pa.RecordBatchReader:
        schema = staged.schema.append(pa.field("dataset", pa.string())).append(
            pa.field("run_date", pa.string())
        )

        def gen() -> Iterator[pa.RecordBatch]:
            for batch in staged.to_batches(batch_size=65_536):
                n = batch.num_rows
                yield pa.RecordBatch.from_arrays(
                    [
                        *batch.columns,
                        pa.array([dataset] * n, pa.string()),
                        pa.array([run_date] * n, pa.string()),
                    ],
                    schema=schema,
                )

        return pa.RecordBatchReader.from_batches(schema, gen())

    def _commit_delta(self, staged: pads.Dataset | None, dataset: str, run_date: str, runs: pa.Table) -> None:
        from deltalake import write_deltalake

        options = delta_storage_options(self.output_uri, self.storage)
        if staged is not None:
            write_deltalake(
                self.results_uri,
                self._batches(staged, dataset, run_date),
                mode="append",
                partition_by=["dataset", "run_date"],
                schema_mode="merge",
                storage_options=options,
            )
        write_deltalake(self.runs_uri, runs, mode="append", schema_mode="merge", storage_options=options)

    def _commit_parquet(
        self, run_id: str, staged: pads.Dataset | None, dataset: str, run_date: str, runs: pa.Table
    ) -> None:
        if staged is not None:
            folder = self._path("results", f"dataset={dataset}", f"run_date={run_date}")
            self.fs.makedirs(folder, exist_ok=True)
            for i, fragment in enumerate(staged.get_fragments()):
                self.fs.copy(fragment.path, f"{folder}/{run_id}-part-{i:06d}.parquet")
        folder = self._path("runs", f"dataset={dataset}")
        self.fs.makedirs(folder, exist_ok=True)
        pq.write_table(runs.drop_columns(["dataset"]), f"{folder}/{run_id}.parquet", filesystem=self.fs)

    # -- reading ---------------------------------------------------------------------------------

    def read_table(self, name: Literal["results", "runs"]) -> pads.Dataset | None:
        """A committed table as a pyarrow dataset (what ``recall-bench query`` hands to DuckDB)."""
        uri = self.results_uri if name == "results" else self.runs_uri
        try:
            if self.format == "delta":
                from deltalake import DeltaTable
                from deltalake.exceptions import TableNotFoundError

                try:
                    return DeltaTable(
                        uri, storage_options=delta_storage_options(uri, self.storage)
                    ).to_pyarrow_dataset()
                except TableNotFoundError:
                    return None
            path = self._path(name)
            if not self.fs.exists(path):
                return None
            ds = pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive")
            if name == "results":
                committed = self.read_table("runs")
                ids = (
                    [] if committed is None else committed.to_table(columns=["run_id"]).column(0).to_pylist()
                )
                return pads.dataset(ds.to_table(filter=pads.field("run_id").isin(ids)))
            return ds
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, uri) from None


def today() -> str:
    """The UTC date used as the ``run_date`` partition."""
    return dt.datetime.now(dt.UTC).date().isoformat()
