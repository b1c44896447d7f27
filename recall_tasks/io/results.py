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

Formats: the tables are written, read and maintained by the output's :class:`~recall_tasks.io.tables.TableBackend`
(:data:`BACKENDS`):
- ``delta`` (default, :mod:`~recall_tasks.io.delta`): a run's rows are appended to ``results`` in ONE Delta commit
  (readers see all of them or none), then its run rows to ``runs``. New pass-through columns are merged into the
  table schema.
- ``parquet`` (:mod:`~recall_tasks.io.parquet`): Hive-partitioned files under ``results/dataset=<d>/run_date=<day>/``;
  the run's ``runs`` file is written last and is the commit marker: ``read_table("results")`` only returns rows of
  runs listed in ``runs``.
- ``iceberg`` (:mod:`~recall_tasks.io.iceberg_backend`): tables in a pyiceberg catalog, one catalog commit per run
  and table; ``<output>`` keeps the caches, chunk files and reports, and records the catalog in ``_warehouse.json``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from recall_tasks.errors import ConfigError, RecallBenchError, one_line
from recall_tasks.io.cache import write_atomically
from recall_tasks.io.delta import DeltaBackend
from recall_tasks.io.iceberg_backend import IcebergBackend
from recall_tasks.io.parquet import ParquetBackend
from recall_tasks.io.schemas import CALIBRATION_SCHEMA, COMPARISON_SCHEMA, LABEL_FIELD, RUN_SCHEMA
from recall_tasks.io.storage import StorageConfig, filesystem, join_uri, translate_storage_error
from recall_tasks.io.tables import TABLES, TableBackend, TableName
from recall_tasks.settings import settings

if TYPE_CHECKING:
    from recall_tasks.io.lease import RunLease

log = logging.getLogger(__name__)

Format = Literal["delta", "parquet", "iceberg"]
FORMATS: tuple[str, ...] = ("delta", "parquet", "iceberg")


@dataclass(frozen=True)
class ChunkPart:
    """One chunk file of a run."""

    path: str


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
        self._backend: TableBackend | None = None
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
    def backend(self) -> TableBackend:
        """The output's tables: written, read and maintained the way of its format."""
        if self._backend is None:
            self._backend = BACKENDS[self.format](self)
        return self._backend

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

    def path(self, *parts: str) -> str:
        """A path under the output on its filesystem (``fs``): ``path("reports", "x.html")``."""
        return "/".join([self.root.rstrip("/"), *parts])

    # -- chunk files -----------------------------------------------------------------------------

    def chunk_path(self, chunk_key: str, run_id: str) -> str:
        """Where a chunk's results go: keyed by its content (reusable by later runs) and the run writing it."""
        return self.path("_chunks", chunk_key[:2], chunk_key, f"{run_id}.parquet")

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
        return self.path("_pending", f"{run_key}.json")

    def begin_run(
        self,
        run_key: str,
        new_run_id: str,
        started_at: dt.datetime,
        *,
        wait: bool = False,
        on_wait: Callable[[str], None] | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> tuple[str, dt.datetime, bool]:
        """The run id for ``run_key``: an unfinished attempt's (resumed=True) or ``new_run_id`` (recorded), with
        this attempt's lease on the marker, renewed until :meth:`end_run` or :meth:`release_run`
        (:mod:`~recall_tasks.io.lease`: a live attempt of the same run refuses this one, or ``wait`` for it).
        ``on_lost`` is told, from the renewing thread, when another attempt took the lease over."""
        from recall_tasks.io.lease import RunLease

        self.lease = RunLease(self.fs, self._marker(run_key), self.output_uri)
        run_id, started, resumed = self.lease.acquire(new_run_id, started_at, wait=wait, on_wait=on_wait)
        self.lease.start_renewing(on_lost=on_lost)
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
        """The rows of a run's chunk files in order."""
        for part in parts:
            table = pq.read_table(part.path, filesystem=self.fs, columns=columns)
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
            backend = self.backend
            rows = (lambda: self._run_batches(run_id, parts, dataset, run_date, label)) if parts else None
            backend.append(
                "results", rows, commit_id=f"recall-bench-results-{run_id}", key=("run_id", run_id),
                partition={"dataset": dataset, "run_date": run_date},
            )  # fmt: skip
            crashpoint("after-results-commit")
            backend.append(
                "runs", lambda: runs_table, commit_id=f"recall-bench-runs-{run_id}", key=("run_id", run_id),
                partition={"dataset": dataset},
            )  # fmt: skip
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

    def append_comparison(self, comparison_id: str, dataset: str, rows: list[dict[str, Any]]) -> None:
        """Record a baseline comparison (overall + segment rows) unless it is already recorded."""
        self._record("comparisons", ("comparison_id", comparison_id), dataset, rows, COMPARISON_SCHEMA)

    def append_calibration(self, calibration_id: str, dataset: str, rows: list[dict[str, Any]]) -> None:
        """Record a calibration (``recall-bench calibrate``: rows per judge and segment) in ONE commit, unless it
        is recorded already; Parquet: ``calibrations/dataset=<d>/<calibration id>.parquet``, written whole."""
        self._record("calibrations", ("calibration_id", calibration_id), dataset, rows, CALIBRATION_SCHEMA)

    def _record(
        self, name: TableName, key: tuple[str, str], dataset: str, rows: list[dict[str, Any]], schema: pa.Schema
    ) -> None:
        """Append the rows of one comparison or calibration (``key``: its id column and id) once."""
        table = pa.Table.from_pylist(rows, schema=schema)
        commit_id = f"recall-bench-{name.removesuffix('s')}-{key[1]}"
        try:
            self.backend.append(name, lambda: table, commit_id=commit_id, key=key, partition={"dataset": dataset})
        except RecallBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, join_uri(self.output_uri, name)) from None

    # -- reading ---------------------------------------------------------------------------------

    def read_table(self, name: TableName) -> pads.Dataset | None:
        """A committed table as a pyarrow dataset (what ``recall-bench query`` hands to DuckDB)."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}")
        uri = join_uri(self.output_uri, name)
        try:
            return self.backend.read(name)
        except RecallBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, uri) from None


#: each format's backend, made from the store (the Iceberg one opens the catalog when first used)
BACKENDS: dict[str, Callable[[ResultStore], TableBackend]] = {
    "delta": lambda store: DeltaBackend(store.output_uri, store.storage),
    "parquet": lambda store: ParquetBackend(store.fs, store.root),
    "iceberg": lambda store: IcebergBackend(store.iceberg),
}


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
        detail = one_line(exc, 200, empty="")
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
