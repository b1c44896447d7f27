"""``recall-bench query`` and ``history``: read the result tables at ``--output`` and print them.

Plain functions with Typer's annotations; :mod:`recall_tasks.cli.app` registers them on the ``recall-bench`` app.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import typer

from recall_tasks._logging import inert
from recall_tasks.cli.common import (
    DEFAULT_OUTPUT,
    FormatOption,
    OutputFormatOption,
    OutputOption,
    RawCellsOption,
    StorageOption,
    _fail,
    _store,
    console,
    err,
)
from recall_tasks.cli.output import OUTPUT_FORMATS, OutputFormat
from recall_tasks.errors import ConfigError, RecallBenchError


def _output_format(value: str) -> OutputFormat:
    if value not in OUTPUT_FORMATS:
        _fail(ConfigError(f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}, got {value!r}"))
    return value  # type: ignore[return-value]


def _print_notice(message: str | None) -> None:
    if message:
        err.print(message, markup=False, highlight=False)


def _print_query(store: Any, output: str, sql: str, limit: int, fmt: OutputFormat, raw_cells: bool = False) -> None:
    """Run ``sql`` on the read-only connection (see recall_tasks.io.sql) and print at most ``limit`` rows
    (``raw_cells``: csv text cells exactly, see cli.output.sheet_cell)."""
    import duckdb

    from recall_tasks.cli.output import cut_notice, print_rows
    from recall_tasks.io.sql import TABLES, connect_readonly, explain_error

    tables = {name: ds for name in TABLES if (ds := store.read_table(name)) is not None}
    con = connect_readonly(tables)
    total: int | None = None
    try:
        rel = con.sql(sql)
        if rel is None:
            return
        rows: Iterable[Any]
        if limit <= 0:
            rows = rel.iter_rows(batch_size=4096)  # streamed: `--limit 0` exports of 1M rows hold one batch
        else:
            head = rel.limit(limit + 1).fetchall()
            if len(head) > limit:
                head, total = head[:limit], rel.aggregate("count(*)").fetchall()[0][0]
            rows = head
        shown = print_rows(rel.columns, rows, fmt, console, raw_cells=raw_cells)
    except duckdb.Error as exc:
        raise explain_error(exc, set(tables), output) from None
    finally:
        con.close()
    _print_notice(cut_notice(shown, total if total is not None else shown))


LimitOption = Annotated[int, typer.Option(help="Print at most this many rows; 0 for all")]


def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables `results`, `runs`, `comparisons` and `calibrations`")],
    output: OutputOption = DEFAULT_OUTPUT,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    limit: LimitOption = 50,
    output_format: OutputFormatOption = "table",
    raw_cells: RawCellsOption = False,
) -> None:
    """Run read-only SQL over the result tables.

    DuckDB sees results, runs, comparisons and calibrations and prints the answer; files, settings and extensions
    are locked.
    """
    fmt = _output_format(output_format)
    try:
        _print_query(_store(output, format, storage_option), output, sql, limit, fmt, raw_cells)
    except RecallBenchError as exc:
        _fail(exc)


def history(
    output: OutputOption = DEFAULT_OUTPUT,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset")] = None,
    format: FormatOption = None,
    storage_option: StorageOption = None,
    limit: Annotated[int, typer.Option(help="Print the latest runs only, at most this many; 0 for all")] = 30,
    output_format: OutputFormatOption = "table",
    metric: Annotated[
        str | None, typer.Option(help="An id metric (recall@10, ndcg@5...): its means, intervals and verdicts")
    ] = None,
    raw_cells: RawCellsOption = False,
) -> None:
    """List the series of runs, each with its verdict.

    Mean with its 95 % CI, pass rate (with the threshold a pass needs), judge, and the verdict against each run's
    baseline. A terminal too narrow for every column drops the baseline run id, judge, dataset, start time (the run
    id holds it), CI and rows, in that order.

    csv and json print the raw fields (ISO timestamps, unrounded numbers, verdict and baseline run id apart).
    """
    import pyarrow.compute as pc

    from recall_tasks.cli.history_fit import history_fit
    from recall_tasks.cli.output import (
        HISTORY_COLUMNS,
        HISTORY_FIELDS,
        cut_notice,
        history_cells,
        history_records,
        print_rows,
    )

    fmt = _output_format(output_format)
    try:
        store = _store(output, format, storage_option)
        runs_ds = store.read_table("runs")
        comparisons_ds = store.read_table("comparisons")
        if runs_ds is None:
            raise ConfigError(f"no runs recorded under {output}")
        runs = runs_ds.to_table()
        if dataset:
            runs = runs.filter(pc.equal(runs.column("dataset"), dataset))
            if runs.num_rows == 0:
                raise ConfigError(f"no runs of dataset {dataset!r} recorded under {output}")
        comparisons = comparisons_ds.to_table() if comparisons_ds is not None else None
        if metric:
            from recall_tasks.cli.id_history import metric_view

            runs, comparisons = metric_view(runs, comparisons, metric)
    except RecallBenchError as exc:
        _fail(exc)
    records = history_records(runs, comparisons)
    shown = records[-limit:] if limit > 0 else records
    if fmt in ("csv", "json"):
        print_rows(HISTORY_FIELDS, ([r[f] for f in HISTORY_FIELDS] for r in shown), fmt, console, raw_cells=raw_cells)
    else:
        columns, cells = list(HISTORY_COLUMNS), [history_cells(r) for r in shown]
        if fmt == "table" and console.is_terminal:  # made inert first: the fit measures what is shown
            columns, cells = history_fit(columns, [[inert(c) for c in row] for row in cells], console.width)
        print_rows(columns, cells, fmt, console, keep_whole=["run_id"])
    _print_notice(cut_notice(len(shown), len(records)))
