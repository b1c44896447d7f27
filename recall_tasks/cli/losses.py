"""What a regressed run prints after its verdict: the segments and the rows that lost most against the baseline.

``run`` and ``demo --regression`` print the same two tables (read from the committed ``comparisons`` and
``results`` tables, the queries shown so they can be rerun with ``recall-bench query``): the segments whose mean
dropped most (``--segment-by``; the verdict's metric, then, in a run with document ids, the id metrics, each row
naming its metric) and the paired rows whose score dropped most. The HTML report lists the
sentences each row lost. Nothing here can fail a committed run: a table that cannot be read is one note.
"""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text

from recall_tasks.cli.common import console, err, plain
from recall_tasks.errors import RecallBenchError

#: Rows and segments listed; the query printed with them lists them all.
ROWS, SEGMENTS = 5, 3
_RUN_ID = re.compile(r"[0-9A-Za-z-]+")  # run ids are ``20261204T081434Z-34962b``: safe inside SQL quotes
_METRIC = re.compile(r"[0-9A-Za-z_@]+")  # contextual_recall, retrieval_ids, recall@10: the same


def lost_rows_sql(baseline_run: str, current_run: str) -> str:
    """The paired rows whose score dropped from the baseline run to the current one, most first."""
    return (
        "SELECT cur.row_id, round(base.score, 4) AS baseline, round(cur.score, 4) AS current, "
        "round(cur.score - base.score, 4) AS delta "
        f"FROM results cur JOIN results base USING (row_id) WHERE cur.run_id = '{current_run}' AND base.run_id = "
        f"'{baseline_run}' AND cur.score < base.score ORDER BY delta, cur.row_id"
    )


def lost_segments_sql(baseline_run: str, current_run: str, metric: str | None = None, *, others: bool = False) -> str:
    """The segments of the comparison whose mean dropped, most first: of ``metric`` (the run's verdict), or with
    ``others`` of every other metric compared (a judged run's id metrics: recall@10, ...), each row its metric's."""
    where = "" if metric is None else f" AND metric {'<>' if others else '='} '{metric}'"
    return (
        "SELECT metric, segment_column, segment_value, verdict, round(mean_delta, 4) AS mean_delta, n_paired, "
        "flips_pass_to_fail AS pass_to_fail FROM comparisons "
        f"WHERE comparison_id = '{current_run}__{baseline_run}' AND segment_column IS NOT NULL AND mean_delta < 0"
        f"{where} ORDER BY mean_delta, metric, segment_column, segment_value"
    )


def print_run_losses(params: Any, summary: Any, output: str) -> None:
    """:func:`print_losses` for a run of ``params`` (its output, format and non-secret storage settings)."""
    from recall_tasks.io.results import ResultStore
    from recall_tasks.io.storage import StorageConfig

    storage = StorageConfig.from_options(params.storage_options)
    print_losses(
        summary, output, ResultStore(params.output_uri, storage, params.format, params.catalog, params.namespace)
    )


def print_losses(summary: Any, output: str, store: Any) -> None:
    """After a regressed verdict: the segments and rows that lost most (``store``: the run's result store)."""
    comparison = summary.get("comparison") if summary else None
    if not comparison or comparison.get("verdict") != "regressed":
        return
    current, baseline = str(comparison["current_run_id"]), str(comparison["baseline_run_id"])
    if not (_RUN_ID.fullmatch(current) and _RUN_ID.fullmatch(baseline)):
        return
    metric = str(summary.get("metric") or "")
    if not _METRIC.fullmatch(metric):
        return
    try:
        _table(store, "Segments that lost most:", lost_segments_sql(baseline, current, metric), SEGMENTS, output)
        _table(
            store, "Segments that lost most by the id metrics (reported, not the verdict):",
            lost_segments_sql(baseline, current, metric, others=True), SEGMENTS, output,
        )  # fmt: skip
        _table(
            store, "Rows that lost most (the HTML report lists the sentences each lost):",
            lost_rows_sql(baseline, current), ROWS, output,
        )  # fmt: skip
    except RecallBenchError as exc:
        err.print(f"[yellow]note:[/] the rows that lost most could not be read: {plain(exc)}", soft_wrap=True)


def _table(store: Any, title: str, sql: str, limit: int, output: str) -> None:
    """``sql``'s first ``limit`` rows under ``title`` (nothing when it has none), and how to list them all."""
    import duckdb

    from recall_tasks.cli.output import print_rows
    from recall_tasks.io.sql import TABLES, connect_readonly, explain_error

    tables = {name: ds for name in TABLES if (ds := store.read_table(name)) is not None}
    con = connect_readonly(tables)
    try:
        rel = con.sql(sql)
        rows = rel.fetchall()
        columns = rel.columns
    except duckdb.Error as exc:
        raise explain_error(exc, set(tables), output) from None
    finally:
        con.close()
    if not rows:
        return
    console.print(Text(f"\n{title}"), soft_wrap=True)
    print_rows(columns, rows[:limit], "table", console)
    if len(rows) > limit:
        console.print(
            Text(f'{limit} of {len(rows)} shown; all: recall-bench query "{sql}" --output {output} --limit 0'),
            soft_wrap=True,
        )
