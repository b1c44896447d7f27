"""What the reports show of a run, read from the store and selected from the tables; no HTML here.

The run's result rows bounded for a 1M-row run (:func:`bounded_results`) in the reports' one "worst first"
order (:func:`worst_first`, also the Markdown report's), headline figures computed from the rows, the trend
series, the run's latest comparison and segment rows, and the extras read back for the worst rows (largest
drops, retrieved chunks). :mod:`recall_tasks.reports.html` renders them.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from recall_tasks.io.results import ResultStore

RESULT_COLUMNS = (
    "run_id", "row_id", "input", "score", "success", "error", "skipped", "cached", "verdicts", "reason",
    "source_file", "source_row", "content_hash",
)  # fmt: skip
"""The result columns a report reads (those present)."""

HEAVY_COLUMNS = ("input", "verdicts", "reason", "content_hash")
"""Columns read for the worst rows only (see :func:`bounded_results`): their text, and the content hash that only
the worst rows' chunks are checked against (:func:`chunks_of_worst`; 28 bytes a row, the largest light column)."""


def timestamp(value: object) -> float:
    """A datetime's POSIX time, for ordering; ``-inf`` for anything else (a missing time sorts first)."""
    return value.timestamp() if isinstance(value, dt.datetime) else -math.inf


def result_scores(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Scores as float64 (null -> NaN), a copy (a view would keep the batch's Arrow buffer); all NaN when the
    column is missing."""
    if "score" not in table.schema.names or table.num_rows == 0:
        return np.full(table.num_rows, np.nan)
    return np.array(pc.cast(table.column("score"), pa.float64()).to_numpy(zero_copy_only=False), dtype=float)


def _flags(table: pa.Table | pa.RecordBatch, name: str, valid: bool = False) -> np.ndarray:
    """Per row: the boolean column ``name`` is true (or, with ``valid``, not null); all False when it is missing."""
    if name not in table.schema.names:
        return np.zeros(table.num_rows, dtype=bool)
    col = pc.is_valid(table.column(name)) if valid else pc.fill_null(pc.cast(table.column(name), pa.bool_()), False)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool)


def worst_first(table: pa.Table) -> pa.Array:
    """Row indices of ``table``: errors first, then lowest score, rows without a score last (a missing ``error``
    or ``score`` column: none). The one "worst rows" order of the reports. Stable: ties keep the table's order."""
    n = table.num_rows
    error = table.column("error") if "error" in table.column_names else pa.nulls(n, pa.string())
    score = table.column("score") if "score" in table.column_names else pa.nulls(n, pa.float64())
    return pc.sort_indices(
        pa.table({"e": pc.is_null(error), "s": score}), sort_keys=[("e", "ascending"), ("s", "ascending", "at_end")]
    )


@dataclass(frozen=True)
class RunRows:
    """A run's result rows as the reports use them, bounded for a 1,000,000-row run (:func:`bounded_results`).

    ``scores``: every row's score (NaN: none), the histogram's; ``figures``: the headline figures of every row,
    used where the runs row has none; ``worst``: the worst rows in :func:`worst_first` order, every result
    column the table has; ``wanted``: the rows asked for by ``row_id`` (the comparison's largest drops, whose
    questions are looked up); ``columns``: the result columns the table has.
    """

    scores: np.ndarray
    figures: dict[str, Any]
    worst: pa.Table
    wanted: pa.Table
    columns: tuple[str, ...]

    @property
    def num_rows(self) -> int:
        return int(self.scores.size)

    @classmethod
    def of(cls, table: pa.Table, keep: int = 50, wanted: list[str] | None = None) -> RunRows:
        """The rows of a table in memory (every row of it: filter it to one run first)."""
        gather = _Gather(table.schema, keep, wanted)
        for batch in table.to_batches(max_chunksize=LIGHT_BATCH_ROWS):
            gather.add(batch)
        return gather.rows()


class _Gather:
    """A :class:`RunRows` built a batch at a time: what it keeps of a batch is its scores, counters, and the rows
    that stay among the worst ``keep`` or are ``wanted``."""

    def __init__(self, schema: pa.Schema, keep: int, wanted: list[str] | None) -> None:
        self.schema, self.keep = schema, keep
        self.wanted = pa.array(sorted(set(wanted or [])), pa.string())
        self.scores: list[np.ndarray] = []
        self.counts = dict.fromkeys((k for k in ("error", "skipped", "cached") if k in schema.names), 0)
        self.passed = self.judged = 0
        self.worst = schema.empty_table()
        self.found: list[pa.Table] = []

    def add(self, batch: pa.RecordBatch) -> None:
        self.scores.append(result_scores(batch))
        for k in self.counts:
            self.counts[k] += int(_flags(batch, k, valid=k == "error").sum())
        if "success" in batch.schema.names:
            success = pc.drop_null(pc.cast(batch.column("success"), pa.bool_()))
            self.judged += len(success)
            self.passed += int(pc.sum(success).as_py() or 0)
        rows = pa.Table.from_batches([batch])
        if not rows.schema.equals(self.schema):  # a file's own types (string, large_string) as the table's
            rows = rows.cast(self.schema)
        if self.keep > 0:  # the kept rows first: ties stay in the table's order
            both = pa.concat_tables([self.worst, rows])
            self.worst = both.take(worst_first(both)[: self.keep])
        if len(self.wanted) and "row_id" in rows.column_names:
            mine = rows.filter(pc.is_in(rows.column("row_id"), value_set=self.wanted))
            if mine.num_rows:
                self.found.append(mine)

    def rows(self) -> RunRows:
        scores = np.concatenate(self.scores) if self.scores else np.full(0, np.nan)
        valid = scores[np.isfinite(scores)]
        figures = {
            "rows": int(scores.size), "scored": int(valid.size), "errors": self.counts.get("error"),
            "skipped": self.counts.get("skipped"), "cached": self.counts.get("cached"),
            "mean_score": float(valid.mean()) if valid.size else None,
            "pass_rate": self.passed / self.judged if self.judged else None,
        }  # fmt: skip
        wanted = pa.concat_tables(self.found) if self.found else self.schema.empty_table()
        return RunRows(scores, figures, self.worst.combine_chunks(), wanted, tuple(self.schema.names))


def bounded_results(results_ds: Any, run_id: str, keep: int = 50, wanted: list[str] | None = None) -> RunRows:
    """The run's rows for the reports: every row's score and figures, and whole rows for the worst ``keep`` (and
    the light columns of the rows of ``wanted`` ids).

    Keeps a 1M-row report in a few MB: the light columns (:data:`RESULT_COLUMNS` but :data:`HEAVY_COLUMNS`) are
    read a batch at a time and folded (:class:`_Gather`), so a row costs its score (8 bytes of NumPy); the
    heavy columns are then read for the worst rows only, the only ones whose text is shown and whose chunks are
    looked up by content hash. A table of every row's light columns was ~35 bytes of Arrow a row and +108 MiB
    of RSS at 1,000,000 rows, its sort and the worst rows' pick +40 more (issue 42, item 3). Both reads go file by
    file (:func:`_run_batches`).
    """
    names = results_ds.schema.names
    light = [c for c in RESULT_COLUMNS if c in names and c not in HEAVY_COLUMNS and c != "run_id"]
    heavy = [c for c in HEAVY_COLUMNS if c in names]
    paths = _parquet_files(results_ds, run_id, ["run_id", *light, *heavy])  # listed once for both reads
    gather = _Gather(pa.schema([results_ds.schema.field(c) for c in light]), keep, wanted)
    for batch in _run_batches(results_ds, paths, run_id, light, LIGHT_BATCH_ROWS):
        gather.add(batch)
    rows = gather.rows()
    if not heavy or rows.worst.num_rows == 0:
        return rows
    worst = rows.worst
    found = list(_run_batches(results_ds, paths, run_id, ["row_id", *heavy], TEXT_BATCH_ROWS,
                              rows=worst.column("row_id")))  # fmt: skip
    detail = pa.Table.from_batches(found) if found else _empty(results_ds, ["row_id", *heavy])
    at = pc.index_in(worst.column("row_id"), value_set=detail.column("row_id"))
    for name in heavy:
        worst = worst.append_column(name, detail.column(name).take(at))
    return replace(rows, worst=worst, columns=(*rows.columns, *heavy))


def _empty(results_ds: Any, columns: list[str]) -> pa.Table:
    """No rows, the table's types for ``columns`` (nothing read)."""
    return pa.schema([results_ds.schema.field(c) for c in columns]).empty_table()


#: Rows decoded at a time for the light columns of every row, and when the worst rows' text is looked for.
LIGHT_BATCH_ROWS = 16_384
TEXT_BATCH_ROWS = 1024


def _run_batches(
    results_ds: Any,
    paths: list[str] | None,
    run_id: str,
    columns: list[str],
    batch_rows: int,
    rows: pa.Array | None = None,
) -> Iterator[pa.RecordBatch]:
    """The batches of ``run_id``'s rows (those of ``rows`` only, when given), with ``columns``: read
    ``batch_rows`` rows at a time from each Parquet file of ``paths`` (:func:`_parquet_files`;
    ``ParquetFile.iter_batches``, no pre-buffering, no readahead), or from a scan of the dataset when None.

    A dataset scan decodes whole row groups with a readahead of several: for the light columns of a 1,000,000-row
    run, +190 MiB of RSS against +78 file by file for a 35 MiB table; for the worst rows' text, ~190 MB for the
    results table's row groups of 65,536 rows, to find 50 rows (issue 42, item 3). A dataset that is not Parquet
    files, is filtered, or whose files lack a column is scanned as before, a batch at a time without readahead.
    """
    wanted = pads.field("run_id") == run_id
    if rows is not None:
        wanted = wanted & pads.field("row_id").isin(rows)
    if paths is None:
        yield from results_ds.to_batches(
            columns=columns, filter=wanted, batch_size=batch_rows, batch_readahead=1, fragment_readahead=1
        )
        return
    for path in paths:
        with results_ds.filesystem.open_input_file(path) as fh:
            parquet = pq.ParquetFile(fh, pre_buffer=False)
            groups = _groups_with(parquet.metadata, run_id)
            if not groups:
                continue
            read = parquet.iter_batches(batch_size=batch_rows, row_groups=groups, columns=["run_id", *columns],
                                        use_threads=False)  # fmt: skip
            for batch in read:  # a mask, not an expression: Table.filter(expression) runs an Acero plan a batch
                mask = pc.equal(batch.column("run_id"), run_id)
                if rows is not None:
                    mask = pc.and_(mask, pc.is_in(batch.column("row_id"), value_set=rows))
                mine = batch.filter(mask).select(columns)
                if mine.num_rows:
                    yield mine


def _groups_with(meta: pq.FileMetaData, run_id: str) -> list[int]:
    """The row groups whose ``run_id`` statistics admit ``run_id`` (all of them without statistics): a file
    compacted by ``maintain`` holds many runs."""
    at = next((k for k in range(meta.num_columns) if meta.schema.column(k).path == "run_id"), None)
    groups = []
    for i in range(meta.num_row_groups):
        stats = None if at is None else meta.row_group(i).column(at).statistics
        if stats is None or not stats.has_min_max or not isinstance(stats.min, str) or stats.min <= run_id <= stats.max:
            groups.append(i)
    return groups


def _parquet_files(results_ds: Any, run_id: str, columns: list[str]) -> list[str] | None:
    """The paths of the Parquet files that may hold ``run_id``'s rows, when each file has ``columns``; else None
    (not a dataset of Parquet files, a filtered one, a file without one of the columns)."""
    if not isinstance(results_ds, pads.FileSystemDataset) or not isinstance(results_ds.format, pads.ParquetFileFormat):
        return None
    try:
        fragments = list(results_ds.get_fragments(filter=pads.field("run_id") == run_id))
    except ValueError:  # a filtered dataset (the parquet format's committed rows) only scans as a whole
        return None
    if any(not set(columns) <= set(f.physical_schema.names) for f in fragments):
        return None
    return [f.path for f in fragments]


def worst_result_rows(rows: RunRows, limit: int) -> list[dict[str, Any]]:
    """The worst ``limit`` rows (:func:`worst_first`: errors first, then scored rows lowest first, then unscored)."""
    if limit <= 0:
        return []
    columns = [c for c in RESULT_COLUMNS if c in rows.worst.column_names and c != "run_id"]
    return cast(list[dict[str, Any]], rows.worst.slice(0, limit).select(columns).to_pylist())


def with_chunks(rows: list[dict[str, Any]], chunks: dict[tuple[str, int], list[str]] | None) -> list[dict[str, Any]]:
    """The rows with their retrieved chunks (``chunks`` by source file and row), unless there are none."""
    if chunks is None:
        return rows
    return [{**r, "chunks": chunks.get((r.get("source_file"), r.get("source_row")))} for r in rows]  # type: ignore[arg-type]


def trend_series(overall: list[dict[str, Any]], run: dict[str, Any], history: int) -> list[dict[str, Any]]:
    """The last ``history`` runs of ``run``'s dataset and metric up to it, oldest first (``overall``: runs rows)."""
    run_id = run["run_id"]
    key = (run.get("dataset"), run.get("metric"))
    series = {r["run_id"]: r for r in overall if (r.get("dataset"), r.get("metric")) == key}
    ordered = sorted(series.values(), key=lambda r: (timestamp(r.get("started_at")), str(r["run_id"])))
    at = next((i for i, r in enumerate(ordered) if r["run_id"] == run_id), None)
    return [] if at is None else ordered[max(0, at + 1 - max(1, history)) : at + 1]


def latest_comparison(
    comparisons: pa.Table | None, run_id: str
) -> tuple[dict[str, Any] | None, dict[tuple[Any, Any], dict[str, Any]]]:
    """The run's latest overall comparison row, and that comparison's segment rows by (column, value)."""
    cmp: dict[str, Any] | None = None
    deltas: dict[tuple[Any, Any], dict[str, Any]] = {}
    if comparisons is not None and comparisons.num_rows and "current_run_id" in comparisons.column_names:
        mine = comparisons.filter(pc.equal(comparisons.column("current_run_id"), run_id)).to_pylist()
        mine = [r for r in mine if "@" not in str(r.get("metric") or "")]  # not an id metric's rows (issue 41)
        mine.sort(key=lambda r: timestamp(r.get("compared_at")))
        tops = [r for r in mine if r.get("segment_column") is None]
        cmp = tops[-1] if tops else None
        if cmp is not None:
            same = [r for r in mine if r.get("comparison_id") == cmp.get("comparison_id") and r.get("segment_column")]
            deltas = {(r.get("segment_column"), r.get("segment_value")): r for r in same}
    return cmp, deltas


def segment_rows(all_runs: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The run's segment rows, by column then value (a null value last)."""
    return sorted(
        (r for r in all_runs if r["run_id"] == run_id and r.get("segment_column") is not None),
        key=lambda r: (str(r.get("segment_column")), r.get("segment_value") is None, str(r.get("segment_value"))),
    )


def read_comparisons(store: ResultStore, run_id: str) -> pa.Table | None:
    """This run's comparison rows, or None when the store has no (readable) comparisons table."""
    try:
        ds = cast(Any, store).read_table("comparisons")
    except (TypeError, ValueError, KeyError):
        return None
    if ds is None or not {"current_run_id", "verdict"} <= set(ds.schema.names):
        return None
    return cast(pa.Table, ds.to_table(filter=pads.field("current_run_id") == run_id))


def largest_drops(store: ResultStore, run_id: str, comparisons: pa.Table | None) -> list[dict[str, Any]]:
    """The rows that lost most against the baseline of the run's latest comparison (none without one)."""
    from recall_tasks.analysis.tracking import largest_drops as drops_of

    if comparisons is None or comparisons.num_rows == 0:
        return []
    overall = [
        r for r in comparisons.to_pylist() if r.get("segment_column") is None and "@" not in str(r.get("metric"))
    ]
    if not overall:
        return []
    latest = max(overall, key=lambda r: timestamp(r.get("compared_at")))
    return [w.model_dump() for w in drops_of(store, run_id, str(latest["baseline_run_id"]))]


def chunks_of_worst(store: ResultStore, run: dict[str, Any], results: RunRows, dataset: Any) -> Any:
    """Retrieved chunks of the worst rows, read back from the dataset when its content is unchanged."""
    from recall_tasks.io.datasets import open_dataset
    from recall_tasks.io.lookup import read_contexts

    if results.num_rows == 0 or not {"source_file", "source_row", "content_hash"} <= set(results.columns):
        return None
    worst = worst_result_rows(results, 15)
    refs = [(r["source_file"], r["source_row"], r["content_hash"]) for r in worst if r.get("source_file")]
    try:
        if dataset is None:
            dataset = open_dataset(str(run.get("dataset_uri")), store.storage, str(run.get("metric")), {})
        return read_contexts(dataset, refs)
    except Exception:  # noqa: BLE001 - best effort: a report never fails a committed run over its chunks
        return {}


def with_questions(
    store: ResultStore, run: dict[str, Any], results: RunRows, drops: list[dict[str, Any]], dataset: Any
) -> list[dict[str, Any]]:
    """The largest drops with each row's ``question``, read back from the dataset (the results table has none).

    The drops' rows are ``results.wanted`` (:func:`bounded_results` was given their ids) or among the worst.
    Best effort, like :func:`chunks_of_worst`: a dataset moved, rewritten or unreadable leaves the drops as they are.
    """
    from recall_tasks.io.datasets import open_dataset
    from recall_tasks.io.lookup import read_questions

    columns = ["source_file", "source_row", "row_id"]
    if not drops or not set(columns) <= set(results.columns):
        return drops
    wanted = pa.array(sorted({str(d.get("row_id")) for d in drops}), pa.string())
    refs: dict[str, tuple[Any, Any, str]] = {}
    for table in (results.worst, results.wanted):
        where = table.filter(pc.is_in(table.column("row_id"), value_set=wanted)).select(columns)
        refs |= {r["row_id"]: (r["source_file"], r["source_row"], r["row_id"]) for r in where.to_pylist()
                 if r["source_file"] is not None}  # fmt: skip
    try:
        if dataset is None:
            dataset = open_dataset(
                str(run.get("dataset_uri")), store.storage, str(run.get("metric")), {}, context_supplied=True
            )
        questions = read_questions(dataset, list(refs.values()))
    except Exception:  # noqa: BLE001 - best effort: a report never fails a committed run over its questions
        return drops
    return [{**d, "question": questions.get(str(d.get("row_id")))} for d in drops]


def lost_ids(store: ResultStore, run_id: str, comparisons: pa.Table | None) -> list[tuple[str, list[str]]]:
    """The rows of ``run_id`` that lost relevant documents its latest baseline retrieved, with the ids lost (none
    without ids or a baseline: ``reports/ids_section.lost_documents``)."""
    from recall_tasks.reports.ids_section import lost_documents

    cmp, _ = latest_comparison(comparisons, run_id)
    ds = cast(Any, store).read_table("results") if cmp is not None else None
    columns = ["row_id", "retrieved_context_ids", "reference_context_ids"]
    if cmp is None or ds is None or not set(columns) <= set(ds.schema.names):
        return []

    def rows_of(rid: str) -> pa.Table:
        return cast(pa.Table, ds.to_table(columns=columns, filter=pads.field("run_id") == rid))

    return lost_documents(rows_of(run_id), rows_of(str(cmp["baseline_run_id"])))
