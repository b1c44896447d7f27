"""Result tables: chunk results written as they finish, then committed all at once.

Layout under ``<output>``:
- ``results/`` per-row results, partitioned by ``dataset`` and ``run_date``;
- ``runs/`` one row per run (``segment_column`` null) plus one per segment value;
- ``comparisons/`` baseline comparisons; ``calibrations/`` judge-vs-human agreement (``recall-bench calibrate``);
- ``_chunks/<kk>/<chunk key>/<run id>.parquet`` the results of one chunk, keyed by the chunk's content and
  configuration (so Prefect's chunk cache can hand them to a later run) — invisible to readers (a leading
  underscore: Spark, Hive, Trino and pyarrow dataset discovery skip it);
- ``_pending/<run key>.json`` the run id of an attempt that has not committed yet: rerunning the same command
  on the same data resumes it (same run id, finished chunks reused, nothing committed twice); while an attempt
  runs, its lease (:mod:`~recall_tasks.io.lease`: one live attempt per run).

Formats:
- ``delta`` (default): a run's rows are appended to ``results`` in ONE Delta commit (readers see all of them
  or none), then its run rows to ``runs``. New pass-through columns are merged into the table schema.
- ``parquet``: Hive-partitioned files under ``results/dataset=<d>/run_date=<day>/``; the run's ``runs`` file is
  written last and is the commit marker: ``read_table("results")`` only returns rows of runs listed in ``runs``.
- ``iceberg``: tables in a pyiceberg catalog (:mod:`~recall_tasks.io.iceberg`), one catalog commit per run and
  table; ``<output>`` keeps the caches, chunk files and reports, and records the catalog in ``_warehouse.json``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from recall_tasks.errors import ConfigError, RecallBenchError
from recall_tasks.io.cache import write_atomically
from recall_tasks.io.schemas import (
    CALIBRATION_SCHEMA,
    COMPARISON_SCHEMA,
    ID_RESULT_FIELDS,
    LABEL_FIELD,
    LATE_RESULT_FIELDS,
    RESULT_FIELDS,
    RUN_SCHEMA,
)
from recall_tasks.io.storage import StorageConfig, delta_storage_options, filesystem, join_uri, translate_storage_error
from recall_tasks.settings import settings

if TYPE_CHECKING:
    from recall_tasks.io.lease import RunLease

log = logging.getLogger(__name__)

#: ``results`` columns added after the table's first release (``schemas.LATE_RESULT_FIELDS``)
LATE_FIELDS = [f for f in [*RESULT_FIELDS, LABEL_FIELD, *ID_RESULT_FIELDS] if f.name in LATE_RESULT_FIELDS]

Format = Literal["delta", "parquet", "iceberg"]
FORMATS: tuple[str, ...] = ("delta", "parquet", "iceberg")

#: Delta commits retried after a conflict with another run's commit (fresh snapshot, schema merged again).
COMMIT_ATTEMPTS = 4

#: Delta data files of ~32 MiB: the writer buffers about one file per partition, which bounds commit memory.
TARGET_FILE_BYTES = 32 * 1024 * 1024


def _writer_properties() -> Any:
    from deltalake import WriterProperties

    return WriterProperties(compression="ZSTD", max_row_group_size=64 * 1024)


@dataclass(frozen=True)
class ChunkPart:
    """One chunk file of a run; ``reused`` when a Prefect cache hit took it from an earlier run."""

    path: str
    reused: bool = False


def _as_cached(table: pa.Table) -> pa.Table:
    """Rows reused from an earlier run cost nothing in this one."""
    n = table.num_rows
    replace = {
        "cached": pa.array([True] * n),
        "prompt_tokens": pa.array([0] * n, pa.int64()),
        "completion_tokens": pa.array([0] * n, pa.int64()),
        "requests": pa.array([0] * n, pa.int32()),
        "cost_usd": pa.array([0.0] * n),
    }
    for name, values in replace.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, values)
    return table


def crashpoint(name: str) -> None:
    """Test hook: ``RECALL_BENCH_CRASH_AT=<name>`` kills the process here (used by the crash-safety tests)."""
    if settings().crash_at == name:
        os.kill(os.getpid(), 9)


@dataclass
class ResultStore:
    """Where a run's results go, and how they are written and committed."""

    output_uri: str
    storage: StorageConfig
    format: Format = "delta"
    catalog: str | None = None
    namespace: str | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        self.fs, self.root = filesystem(self.output_uri, self.storage)
        self._iceberg: Any = None
        self.lease: RunLease | None = None  # this attempt's hold on its run's marker (begin_run)

    @property
    def iceberg(self) -> Any:
        """The output's :class:`~recall_tasks.io.iceberg.IcebergTables` (``--format iceberg``)."""
        if self._iceberg is None:
            from recall_tasks.io.iceberg import IcebergTables, resolve_location

            where = resolve_location(self.fs, self.root, self.output_uri, self.catalog, self.namespace)
            self._iceberg = IcebergTables(self.output_uri, self.storage, where, self.fs, self.root)
        return self._iceberg

    @property
    def results_uri(self) -> str:
        return join_uri(self.output_uri, "results")

    @property
    def runs_uri(self) -> str:
        return join_uri(self.output_uri, "runs")

    @property
    def comparisons_uri(self) -> str:
        return join_uri(self.output_uri, "comparisons")

    @property
    def calibrations_uri(self) -> str:
        return join_uri(self.output_uri, "calibrations")

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    # -- chunk files -----------------------------------------------------------------------------

    def chunk_path(self, chunk_key: str, run_id: str) -> str:
        """Where a chunk's results go: keyed by its content (reusable by later runs) and the run writing it."""
        return self._path("_chunks", chunk_key[:2], chunk_key, f"{run_id}.parquet")

    def write_chunk(self, path: str, table: pa.Table) -> None:
        """Write one chunk's results whole (a retried task rewrites the same file)."""
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            write_atomically(self.fs, path, table)
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None

    def exists(self, path: str) -> bool:
        try:
            return bool(self.fs.exists(path))
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None

    # -- resumable runs --------------------------------------------------------------------------

    def _marker(self, run_key: str) -> str:
        return self._path("_pending", f"{run_key}.json")

    def begin_run(
        self, run_key: str, new_run_id: str, started_at: dt.datetime, *, wait: bool = False
    ) -> tuple[str, dt.datetime, bool]:
        """The run id for ``run_key``: an unfinished attempt's (resumed=True) or ``new_run_id`` (recorded), with
        this attempt's lease on the marker, renewed until :meth:`end_run` or :meth:`release_run`
        (:mod:`~recall_tasks.io.lease`: a live attempt of the same run refuses this one, or ``wait`` for it)."""
        from recall_tasks.io.lease import RunLease

        self.lease = RunLease(self.fs, self._marker(run_key), self.output_uri)
        run_id, started, resumed = self.lease.acquire(new_run_id, started_at, wait=wait)
        self.lease.start_renewing()
        return run_id, started, resumed

    def release_run(self) -> None:
        """This attempt ends without a commit: let go of its lease, keep the marker (the rerun resumes)."""
        if self.lease is not None:
            self.lease.release()

    def end_run(self, run_key: str) -> None:
        """Forget the unfinished-attempt marker once the run is committed."""
        if self.lease is not None:
            self.lease.end()
            return
        try:
            if self.fs.exists(self._marker(run_key)):
                self.fs.rm(self._marker(run_key))
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None

    # -- commit ----------------------------------------------------------------------------------

    def read_parts(self, parts: list[ChunkPart], columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The rows of a run's chunk files in order; rows of chunks reused from earlier runs read as cached."""
        for part in parts:
            table = pq.read_table(part.path, filesystem=self.fs, columns=columns)
            if part.reused:
                table = _as_cached(table)
            yield from table.to_batches(max_chunksize=65_536)

    def commit(
        self,
        run_id: str,
        dataset: str,
        run_date: str,
        parts: list[ChunkPart],
        runs: list[dict[str, Any]],
        label: str | None = None,
    ) -> None:
        """Make a run's results visible at once, then append its run rows. Idempotent per run id.

        ``label``: the run's ``--label``, written on each of its result rows (``results.label``, the last column:
        added after the table's first release, so older rows read null).

        A crash after the results commit and before the runs commit is finished by the rerun (same run id):
        results already committed for the run id are not appended again (Delta: the commit's app transaction id).
        """
        runs_table = pa.Table.from_pylist(runs, schema=RUN_SCHEMA)
        try:
            if self.format == "delta":
                self._commit_delta(run_id, parts, dataset, run_date, runs_table, label)
            elif self.format == "iceberg":
                self._commit_iceberg(run_id, parts, dataset, run_date, runs_table, label)
            else:
                self._commit_parquet(run_id, parts, dataset, run_date, runs_table, label)
        except RecallBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.output_uri) from None

    def _run_batches(
        self, run_id: str, parts: list[ChunkPart], dataset: str, run_date: str, label: str | None = None
    ) -> pa.RecordBatchReader:
        first = pq.read_schema(parts[0].path, filesystem=self.fs)
        schema = pa.schema(
            [pa.field("run_id", pa.string(), nullable=False), *first,
             pa.field("dataset", pa.string()), pa.field("run_date", pa.string()), LABEL_FIELD]
        )  # fmt: skip

        def gen() -> Iterator[pa.RecordBatch]:
            for batch in self.read_parts(parts):
                n = batch.num_rows
                yield pa.RecordBatch.from_arrays(
                    [pa.array([run_id] * n, pa.string()), *batch.select(first.names).columns,
                     pa.array([dataset] * n, pa.string()), pa.array([run_date] * n, pa.string()),
                     pa.array([label] * n, pa.string())],
                    schema=schema,
                )  # fmt: skip

        return pa.RecordBatchReader.from_batches(schema, gen())

    def _delta_append(self, uri: str, data: Any, app_id: str, **kwargs: Any) -> None:
        """Append once per ``app_id``: a Delta app transaction (``txn``) is recorded in the same commit.

        The check and the write use ONE snapshot of the table (created empty first if missing): a commit that
        lands after that snapshot with the same app id makes ours fail ("concurrent transaction"), and we then
        find the winner's id and skip. So a rerun and two processes committing the same run at once both end
        with the rows once, without scanning the table. A conflict with ANOTHER run's commit (two datasets with
        different pass-through columns merging the schema at the same moment: "Metadata changed since last
        commit") is retried on a fresh snapshot, up to :data:`COMMIT_ATTEMPTS` times. ``data`` may be a
        callable returning a fresh reader, since a streamed reader can be written only once.
        """
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError, TableNotFoundError

        options = delta_storage_options(self.output_uri, self.storage)
        schema = data().schema if callable(data) else data.schema
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
        for attempt in range(COMMIT_ATTEMPTS):
            try:  # a reader is streamed once: each attempt gets a fresh one (memory stays bounded)
                rows = data() if callable(data) else data
                write_deltalake(table, rows, mode="append", schema_mode="merge", commit_properties=props, **kwargs)
                return
            except CommitFailedError as exc:
                table = DeltaTable(uri, storage_options=options)  # a fresh snapshot
                if table.transaction_version(app_id) is not None:
                    log.info("%s was committed by a concurrent writer; not appended again", app_id)
                    return
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                # another run committed first (e.g. a schema merge of its own pass-through columns): retry
                log.info("%s: commit conflict (%s); retrying on the new table version", app_id, exc)

    def _commit_delta(
        self, run_id: str, parts: list[ChunkPart], dataset: str, run_date: str, runs: pa.Table, label: str | None
    ) -> None:
        if parts:
            self._delta_append(
                self.results_uri, lambda: self._run_batches(run_id, parts, dataset, run_date, label),
                f"recall-bench-results-{run_id}",
                partition_by=["dataset", "run_date"], target_file_size=TARGET_FILE_BYTES,
                writer_properties=_writer_properties(),
            )  # fmt: skip
        crashpoint("after-results-commit")
        self._delta_append(self.runs_uri, runs, f"recall-bench-runs-{run_id}")

    def _commit_iceberg(
        self, run_id: str, parts: list[ChunkPart], dataset: str, run_date: str, runs: pa.Table, label: str | None
    ) -> None:
        if parts:
            self.iceberg.append(
                "results", lambda: self._run_batches(run_id, parts, dataset, run_date, label),
                f"recall-bench-results-{run_id}", partition_by=["dataset", "run_date"], key=("run_id", run_id),
            )  # fmt: skip
        crashpoint("after-results-commit")
        self.iceberg.append("runs", lambda: runs, f"recall-bench-runs-{run_id}", key=("run_id", run_id))

    def _commit_parquet(
        self, run_id: str, parts: list[ChunkPart], dataset: str, run_date: str, runs: pa.Table, label: str | None
    ) -> None:
        folder = self._path("results", f"dataset={dataset}", f"run_date={run_date}")
        self.fs.makedirs(folder, exist_ok=True)
        if parts:
            group: list[pa.RecordBatch] = []
            index = 0

            def flush() -> None:
                nonlocal group, index
                table = pa.Table.from_batches(group).drop_columns(["dataset", "run_date"])
                write_atomically(self.fs, f"{folder}/{run_id}-part-{index:05d}.parquet", table)
                group, index = [], index + 1

            for batch in self._run_batches(run_id, parts, dataset, run_date, label):
                group.append(batch)
                if sum(b.num_rows for b in group) >= 250_000:
                    flush()
            if group:
                flush()
        crashpoint("after-results-commit")
        folder = self._path("runs", f"dataset={dataset}")
        self.fs.makedirs(folder, exist_ok=True)
        write_atomically(self.fs, f"{folder}/{run_id}.parquet", runs.drop_columns(["dataset"]))

    def append_comparison(self, comparison_id: str, dataset: str, rows: list[dict[str, Any]]) -> None:
        """Record a baseline comparison (overall + segment rows) unless it is already recorded."""
        table = pa.Table.from_pylist(rows, schema=COMPARISON_SCHEMA)
        try:
            if self.format == "delta":
                self._delta_append(self.comparisons_uri, table, f"recall-bench-comparison-{comparison_id}")
            elif self.format == "iceberg":
                self.iceberg.append(
                    "comparisons", lambda: table, f"recall-bench-comparison-{comparison_id}",
                    key=("comparison_id", comparison_id),
                )  # fmt: skip
            else:
                folder = self._path("comparisons", f"dataset={dataset}")
                self.fs.makedirs(folder, exist_ok=True)
                write_atomically(self.fs, f"{folder}/{comparison_id}.parquet", table.drop_columns(["dataset"]))
        except RecallBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.comparisons_uri) from None

    def append_calibration(self, calibration_id: str, dataset: str, rows: list[dict[str, Any]]) -> None:
        """Record a calibration (``recall-bench calibrate``: rows per judge and segment) in ONE commit, unless it
        is recorded already; Parquet: ``calibrations/dataset=<d>/<calibration id>.parquet``, written whole."""
        table = pa.Table.from_pylist(rows, schema=CALIBRATION_SCHEMA)
        try:
            if self.format == "delta":
                self._delta_append(self.calibrations_uri, table, f"recall-bench-calibration-{calibration_id}")
            elif self.format == "iceberg":
                self.iceberg.append(
                    "calibrations", lambda: table, f"recall-bench-calibration-{calibration_id}",
                    key=("calibration_id", calibration_id),
                )  # fmt: skip
            else:
                folder = self._path("calibrations", f"dataset={dataset}")
                self.fs.makedirs(folder, exist_ok=True)
                write_atomically(self.fs, f"{folder}/{calibration_id}.parquet", table.drop_columns(["dataset"]))
        except RecallBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.calibrations_uri) from None

    # -- reading ---------------------------------------------------------------------------------

    def read_table(self, name: Literal["results", "runs", "comparisons", "calibrations"]) -> pads.Dataset | None:
        """A committed table as a pyarrow dataset (what ``recall-bench query`` hands to DuckDB)."""
        if name not in ("results", "runs", "comparisons", "calibrations"):
            raise ValueError(f"unknown table {name!r}")
        uri = join_uri(self.output_uri, name)
        try:
            if self.format == "delta":
                from deltalake import DeltaTable
                from deltalake.exceptions import TableNotFoundError

                try:
                    options = delta_storage_options(uri, self.storage)
                    return DeltaTable(uri, storage_options=options).to_pyarrow_dataset()
                except TableNotFoundError:
                    return None
            if self.format == "iceberg":
                return cast("pads.Dataset | None", self.iceberg.dataset(name))
            path = self._path(name)
            if not self.fs.exists(path):
                return None
            ds = pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive")
            late = [f for f in LATE_FIELDS if f.name not in ds.schema.names] if name == "results" else []
            if late:
                # the schema is the first file's: one written before a late column existed still shows the column
                # (null in its rows, the values in later files)
                schema = pa.schema([*ds.schema, *late])
                ds = pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive", schema=schema)
            if name != "results":  # small tables whose files span versions: every file's columns
                schemas = [fragment.physical_schema for fragment in ds.get_fragments()]
                unified = pa.unify_schemas([*schemas, ds.schema], promote_options="permissive")
                ds = pads.dataset(path, filesystem=self.fs, format="parquet", partitioning="hive", schema=unified)
            if name == "results":
                committed = self.read_table("runs")
                ids = [] if committed is None else committed.to_table(columns=["run_id"]).column(0).to_pylist()
                return ds.filter(pads.field("run_id").isin(pa.array(ids, pa.string())))
            return ds
        except RecallBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, uri) from None


def today() -> str:
    """The UTC date used as the ``run_date`` partition."""
    return dt.datetime.now(dt.UTC).date().isoformat()


def formats_at(output_uri: str, storage: StorageConfig) -> list[Format]:
    """The formats of the tables already at ``output_uri`` (none, one, or more on an output an older
    recall-bench let two formats write to). One listing per table folder and one marker lookup.

    * iceberg: a ``_warehouse.json``, or a table folder holding ``metadata/`` (the embedded catalog's tables);
    * delta: a table folder holding ``_delta_log``;
    * parquet: ``runs/``, ``comparisons/`` or ``calibrations/`` holding ``dataset=…`` partitions (Delta and Iceberg
      never partition them), or ``results/`` holding them without a ``_delta_log``.
    """
    from recall_tasks.io.iceberg import MARKER

    try:
        fs, root = filesystem(output_uri, storage)
    except (ValueError, ImportError) as exc:  # an unknown protocol, a filesystem whose package is not installed
        detail = " ".join(str(exc).split())[:200]
        raise ConfigError(f"cannot open the output {output_uri}: {detail}") from None
    base = root.rstrip("/")
    found: set[str] = set()
    try:
        if fs.exists(f"{base}/{MARKER}"):
            found.add("iceberg")
        for name in ("runs", "results", "comparisons", "calibrations"):
            try:
                entries = {str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(f"{base}/{name}", detail=False)}
            except FileNotFoundError:
                continue
            if "_delta_log" in entries:
                found.add("delta")
            if "metadata" in entries:
                found.add("iceberg")
            partitioned = any(e.startswith("dataset=") for e in entries)
            if partitioned and (name != "results" or "_delta_log" not in entries):
                found.add("parquet")
    except Exception as exc:  # noqa: BLE001
        raise translate_storage_error(exc, output_uri) from None
    return [cast("Format", f) for f in FORMATS if f in found]


def _mixed(output_uri: str, found: list[Format]) -> str:
    return (
        f"--output {output_uri} holds tables of {len(found)} formats ({' and '.join(found)}), written by an "
        "earlier recall-bench that did not refuse it"
    )


def detect_format(output_uri: str, storage: StorageConfig) -> Format:
    """The format of the tables already at ``output_uri`` (what readers use when ``--format`` is not given).

    See :func:`formats_at`; an output with no table yet gets the default, delta. An output holding two formats is
    refused: say which one to read with ``--format``.
    """
    found = formats_at(output_uri, storage)
    if len(found) > 1:
        raise ConfigError(f"{_mixed(output_uri, found)}: pass --format to read one; maintain and run refuse it")
    return found[0] if found else "delta"


def check_format(output_uri: str, storage: StorageConfig, asked: str, *, writes: bool) -> None:
    """One output holds one format: refuse ``asked`` when the output already holds another one.

    ``writes`` (run, maintain): an output holding two formats is refused whatever is asked (maintenance of one
    format would delete the other's files as orphans); a reader may pick one of them with ``--format``.
    """
    found = formats_at(output_uri, storage)
    if not found or found == [asked]:
        return
    if len(found) > 1:
        if writes or asked not in found:
            raise ConfigError(
                f"{_mixed(output_uri, found)}: refused for --format {asked}; move one format's tables to another "
                "--output first"
            )
        return
    raise ConfigError(
        f"--output {output_uri} holds {found[0]} tables, --format {asked} asked: one output holds one format; "
        f"drop --format (and --catalog) to use {found[0]}, or write {asked} to another --output"
    )
