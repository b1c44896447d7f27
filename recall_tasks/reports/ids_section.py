"""The HTML report's id metrics section (issue 41 item 6): recall@k against k for the run and its baseline
(inline SVG, each point with its 95 % interval), and the rows that lost relevant documents with the ids lost.

Pure functions of the ``runs`` rows (``id_metrics``, ``id_metrics_low``/``_high``) and the two runs' ``results``
rows (``row_id``, ``retrieved_context_ids``, ``reference_context_ids``); empty when the run has no id metrics.
"""

from __future__ import annotations

import html
from typing import Any

import pyarrow as pa

from recall_tasks.reports.html_sections import SERIES_COLORS, finite

_ID_COLUMNS = ("row_id", "retrieved_context_ids", "reference_context_ids")


def _curve(run: dict[str, Any] | None, column: str = "id_metrics") -> dict[int, float]:
    """``{k: recall@k}`` of a run's row (a map read back as pairs or as a dict)."""
    value = (run or {}).get(column) or {}
    pairs = value.items() if isinstance(value, dict) else value
    out: dict[int, float] = {}
    for name, v in pairs:
        metric, _, k = str(name).partition("@")
        if metric == "recall" and k.isdigit() and (f := finite(v)) is not None:
            out[int(k)] = f
    return dict(sorted(out.items()))


def lost_documents(current: pa.Table, baseline: pa.Table, limit: int = 20) -> list[tuple[str, list[str]]]:
    """Rows whose relevant documents the baseline retrieved and this run did not: ``(row_id, ids lost)``, most
    lost first."""
    if not all(c in current.column_names and c in baseline.column_names for c in _ID_COLUMNS):
        return []
    before = {
        r["row_id"]: set(r["retrieved_context_ids"] or []) for r in baseline.select(list(_ID_COLUMNS)).to_pylist()
    }
    lost = []
    for r in current.select(list(_ID_COLUMNS)).to_pylist():
        relevant, now = r["reference_context_ids"] or [], set(r["retrieved_context_ids"] or [])
        gone = [d for d in dict.fromkeys(relevant) if d in before.get(r["row_id"], set()) and d not in now]
        if gone:
            lost.append((str(r["row_id"]), gone))
    lost.sort(key=lambda item: (-len(item[1]), item[0]))
    return lost[:limit]


def ids_section(run: dict[str, Any], baseline: dict[str, Any] | None, lost: list[tuple[str, list[str]]]) -> str:
    """recall@k vs k (this run, its baseline) and the rows that lost relevant documents; "" without id metrics."""
    series = [(str(run.get("label") or run.get("run_id")), run, SERIES_COLORS[1])]
    if baseline is not None and _curve(baseline):
        series.append((f"baseline {baseline.get('label') or baseline.get('run_id')}", baseline, SERIES_COLORS[0]))
    ks = sorted({k for _, r, _ in series for k in _curve(r)})
    if not ks:
        return ""
    width, height, left, top, bottom = 640, 240, 56, 12, 40
    plot_w, plot_h = width - left - 12, height - top - bottom

    def x(k: int) -> float:
        return left + plot_w * (ks.index(k) + 0.5) / len(ks)

    def y(v: float) -> float:
        return top + plot_h * (1 - v)

    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line class="grid" x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}"/>'
                   f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')  # fmt: skip
    for k in ks:
        out.append(f'<text x="{x(k):.1f}" y="{top + plot_h + 16}" text-anchor="middle">k={k}</text>')
    for name, r, color in series:
        curve, low, high = _curve(r), _curve(r, "id_metrics_low"), _curve(r, "id_metrics_high")
        points = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in curve.items())
        out.append(f'<polyline class="line" style="stroke:{color}" points="{points}"/>')
        for k, v in curve.items():
            if k in low and k in high:
                out.append(f'<line class="whisker" x1="{x(k):.1f}" y1="{y(low[k]):.1f}" x2="{x(k):.1f}" '
                           f'y2="{y(high[k]):.1f}"/>')  # fmt: skip
            tip = html.escape(f"{name}: recall@{k} {v:.3f}")
            out.append(f'<circle class="point" style="fill:{color}" cx="{x(k):.1f}" cy="{y(v):.1f}" r="4">'
                       f"<title>{tip}</title></circle>")  # fmt: skip
    out.append("</svg>")
    legend = "".join(
        f'<span class="legend"><span class="swatch" style="background:{color}"></span>{html.escape(name)}</span>'
        for name, _, color in series
    )
    rows = "".join(
        f"<tr><td><code>{html.escape(row_id)}</code></td><td>{html.escape(', '.join(ids))}</td></tr>"
        for row_id, ids in lost
    )
    table = (
        "<h3>Rows that lost relevant documents</h3>\n<table><tr><th>row id</th><th>relevant ids the baseline "
        f"retrieved and this run did not</th></tr>{rows}</table>"
        if lost
        else ""
    )
    note = "recall@k of the id metrics (mean over the assessed rows, 95 % interval) for each --k."
    return f'<h2>Recall@k from document ids</h2>\n{"".join(out)}\n<p class="muted">{legend}<br>{note}</p>{table}'
