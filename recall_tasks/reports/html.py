"""A self-contained HTML report of one run: header figures, regression verdict, histogram, trend, segments, worst rows.

:func:`render_report` is a pure function over the ``runs``, ``results`` and (optional) ``comparisons`` tables. It
returns one HTML5 document with inline CSS and hand-drawn inline SVG: no JavaScript, no external reference, so the
file can be mailed, attached as an artifact or opened straight from object storage. Every value taken from the data
is escaped with :func:`html.escape`. Missing optional columns, null/NaN intervals, empty runs and runs with only
errors render as dashes and short notes instead of failing.

:func:`write_report` reads the tables of a :class:`~recall_tasks.io.results.ResultStore` (only the run's own result
rows) and writes ``<output>/reports/<run_id>.html``.

What is shown is read and selected in :mod:`~recall_tasks.reports.run_data`; the sections' HTML and SVG are drawn in
:mod:`~recall_tasks.reports.html_sections`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.errors import ConfigError
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import join_uri, translate_storage_error
from recall_tasks.reports import html_sections as sections
from recall_tasks.reports import run_data
from recall_tasks.reports.html_sections import BINS
from recall_tasks.reports.ids_section import ids_section

__all__ = ["BINS", "render_report", "render_run_report", "write_report"]


def render_report(
    run_id: str,
    runs: pa.Table,
    results: pa.Table | run_data.RunRows,
    comparisons: pa.Table | None = None,
    *,
    history: int = 20,
    worst: int = 15,
    drops: list[dict[str, Any]] | None = None,
    chunks: dict[tuple[str, int], list[str]] | None = None,
    lost: list[tuple[str, list[str]]] | None = None,
) -> str:
    """The HTML report of ``run_id``. ``runs`` may hold other runs and datasets (filtered here); ``results``: the
    run's :class:`~recall_tasks.reports.run_data.RunRows`, or a table of result rows (other runs' filtered here).

    ``drops``: the rows that lost most against the baseline (``tracking.largest_drops``); ``chunks``: retrieved
    chunks of the worst rows by (source file, row) (``blocks.read_contexts``); ``lost``: the rows that lost relevant
    documents against the baseline, with the ids lost (``run_data.lost_ids``).
    """
    if isinstance(results, pa.Table):
        if "run_id" in results.column_names and results.num_rows:
            results = results.filter(pc.equal(results.column("run_id"), run_id))
        results = run_data.RunRows.of(results, keep=worst)
    all_runs = runs.to_pylist()
    overall = [r for r in all_runs if r.get("segment_column") is None]
    run: dict[str, Any] = next((r for r in reversed(overall) if r["run_id"] == run_id), {"run_id": run_id})
    scores = results.scores
    figures = {k: run.get(k) if run.get(k) is not None else v for k, v in results.figures.items()}
    finite = scores[np.isfinite(scores)]
    scale = sections.finite(run.get("scale")) or 0.0
    scale = scale if scale > 0 else max(1.0, float(finite.max()) if finite.size else 1.0)
    cmp, deltas = run_data.latest_comparison(comparisons, run_id)
    worst_rows = run_data.with_chunks(run_data.worst_result_rows(results, worst), chunks)
    base = next((r for r in reversed(overall) if cmp is not None and r["run_id"] == cmp.get("baseline_run_id")), None)
    title = f"Recall report – {run.get('dataset') or 'unknown dataset'} – {run_id}"
    return sections.document(
        title,
        [
            sections.header_section(run, figures),
            sections.verdict_section(cmp),
            sections.histogram_section(scores, scale, figures),
            sections.trend_section(run_data.trend_series(overall, run, history), run_id),
            sections.drops_section(drops or []),
            sections.segments_section(run_data.segment_rows(all_runs, run_id), deltas),
            sections.worst_section(worst_rows, "input" in results.columns),
            ids_section(run, base, lost or []),
        ],
    )


def render_run_report(
    store: ResultStore,
    run_id: str,
    results: run_data.RunRows | None = None,
    dataset: Any = None,
    drops: list[dict[str, Any]] | None = None,
) -> str:
    """The HTML report of ``run_id`` read from ``store`` (``recall-bench report --to`` writes it locally).

    ``results``: the run's ``bounded_results`` when the caller already read them (the flow shares one scan; read
    with ``drops``' row ids); ``dataset``: the run's open :class:`~recall_tasks.io.datasets.Dataset` (the flow's),
    else the runs table's ``dataset_uri`` is opened to show the worst rows' chunks, when its content still
    matches; ``drops``: the comparison's worst rows when the caller has them (the flow), else computed from the
    tables.
    """
    runs_ds = store.read_table("runs")
    runs = runs_ds.to_table() if runs_ds is not None else None
    if runs is None or runs.num_rows == 0 or run_id not in runs.column("run_id").to_pylist():
        raise ConfigError(f"run {run_id} not found in {store.runs_uri}")
    comparisons = run_data.read_comparisons(store, run_id)
    if drops is None:
        drops = run_data.largest_drops(store, run_id, comparisons)
    if results is None:
        results_ds = store.read_table("results")
        if results_ds is None:
            results = run_data.RunRows.of(pa.table({"run_id": pa.array([], pa.string())}))
        else:
            results = run_data.bounded_results(results_ds, run_id, wanted=[str(d.get("row_id")) for d in drops])
    run = next(r for r in runs.to_pylist() if r["run_id"] == run_id and r.get("segment_column") is None)
    chunks = run_data.chunks_of_worst(store, run, results, dataset)
    drops = run_data.with_questions(store, run, results, drops, dataset)
    lost = run_data.lost_ids(store, run_id, comparisons)
    return render_report(run_id, runs, results, comparisons, drops=drops, chunks=chunks, lost=lost)


def write_report(
    store: ResultStore,
    run_id: str,
    results: run_data.RunRows | None = None,
    dataset: Any = None,
    drops: list[dict[str, Any]] | None = None,
) -> str:
    """Render the report of ``run_id`` from ``store`` and write ``<output>/reports/<run_id>.html``; its URI.

    ``results``, ``dataset`` and ``drops``: as for :func:`render_run_report`.
    """
    document = render_run_report(store, run_id, results, dataset, drops)
    path = store.path("reports", f"{run_id}.html")
    uri = join_uri(store.output_uri, "reports", f"{run_id}.html")
    try:
        store.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with store.fs.open(path, "w") as fh:
            fh.write(document)
    except Exception as exc:  # noqa: BLE001
        raise translate_storage_error(exc, uri) from None
    return uri
