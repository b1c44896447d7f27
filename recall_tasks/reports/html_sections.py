"""The HTML report's sections as HTML strings: header figures, regression verdict, score histogram and trend
(hand-drawn inline SVG), largest drops, segments, worst rows; the stylesheet and the escaping helpers.

Every value taken from the data is escaped with :func:`html.escape`; missing values and null/NaN intervals
render as dashes. :func:`recall_tasks.reports.html.render_report` puts the sections together.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from typing import Any, cast

import numpy as np

from recall_tasks.reports.formatting import DASH, fmt_number

BINS = 10
"""Number of histogram bins over ``[0, scale]``."""

VERDICT_COLORS = {
    "regressed": "#c62828", "improved": "#2e7d32", "unchanged": "#546e7a", "no_overlap": "#8d6e00",
    "incomparable": "#6a1b9a", "too_few_rows": "#8d6e00",
}  # fmt: skip
SERIES_COLORS = ("#5c8dd6", "#e65100", "#2e7d32", "#6a1b9a", "#00838f", "#8d6e00")

CSS = """
body{font:14px/1.45 system-ui,sans-serif;color:#222;max-width:1000px;margin:24px auto;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555}.meta b{color:#222}code{background:#f3f3f3;padding:0 3px;border-radius:3px}.warn{color:#8d6e00}
.figures{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}.fig .k{color:#666;font-size:12px}
.fig{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:100px}.fig .v{font-size:20px;font-weight:600}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:2px 10px;font-weight:700;letter-spacing:.04em}
table{border-collapse:collapse;width:100%}th{background:#f6f6f6}.err{color:#c62828}.muted{color:#777}
th,td{border-bottom:1px solid #eee;padding:4px 8px;text-align:left;vertical-align:top}ul.miss{margin:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}svg text{font-size:11px;fill:#444}
.bar{fill:#5c8dd6}.line{fill:none;stroke:#5c8dd6;stroke-width:1.5}.whisker{stroke:#888;stroke-width:1.2}
.point{fill:#5c8dd6}.point.current{fill:#e65100;stroke:#222}.grid{stroke:#eee}.axis{stroke:#999}
text.current{font-weight:700;fill:#e65100}text.axis-label{fill:#666;font-style:italic}
.legend{margin-right:14px;white-space:nowrap}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
ol.chunks{margin:4px 0 0;padding-left:22px;color:#444}ol.chunks li.used{color:#2e7d32}
"""


def _e(value: object) -> str:
    """Escaped text of a data value (a dash for None)."""
    return DASH if value is None else html.escape(str(value))


def finite(value: object) -> float | None:
    """A finite float, or None (None, NaN, infinities and non-numbers)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(cast(float, value)) if ok else None


def _fmt(value: object, spec: str = ".3f") -> str:
    """A number formatted with ``spec``, or a dash when it is missing or not finite."""
    return fmt_number(finite(value), spec)


def _ci(low: object, high: object) -> str:
    lo, hi = finite(low), finite(high)
    return "CI n/a" if lo is None or hi is None else f"95 % CI [{lo:.3f}, {hi:.3f}]"


def _when(value: object) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if isinstance(value, dt.datetime) else str(value or DASH)


def _clip(text: object, limit: int) -> str:
    """Escaped text cut to ``limit`` characters (cut before escaping, so no entity is broken)."""
    return _e(text if len(s := str(text)) <= limit else s[: limit - 1] + "…")


def header_section(run: dict[str, Any], figures: dict[str, Any]) -> str:
    dataset = run.get("dataset") or "unknown dataset"
    meta = [
        f"run <code>{_e(run['run_id'])}</code>",
        f"label <b>{_e(run.get('label'))}</b>",
        *(
            [f"index version <b>{_e(run.get('index_version'))}</b>"]
            if run.get("index_version") and run.get("index_version") != run.get("label")
            else []
        ),
        f"metric <b>{_e(run.get('metric'))}</b>",
        f"judge <b>{_e(run.get('judge_model'))}</b> (prompt {_e(run.get('prompt_version'))})",
        f"started {_e(_when(run.get('started_at')))}",
        f"finished {_e(_when(run.get('finished_at')))}",
    ]
    cards = [
        (_fmt(figures["mean_score"]), f"mean score, {_ci(run.get('ci_low'), run.get('ci_high'))}"),
        (_fmt(figures["pass_rate"], ".1%"), f"pass rate at threshold {_fmt(run.get('threshold'), 'g')}"),
        *[(_e(figures[k]), k) for k in ("rows", "scored", "errors", "skipped", "cached")],
    ]
    out = [f"<h1>Contextual recall – {_e(dataset)}</h1>", f'<p class="meta">{" · ".join(meta)}</p>']
    if run.get("status") not in (None, "ok", "success", "completed"):
        out.append(f'<p class="warn">status {_e(run.get("status"))}: {_e(run.get("status_reason"))}</p>')
    cells = "".join(f'<div class="fig"><div class="v">{v}</div><div class="k">{k}</div></div>' for v, k in cards)
    out.append(f'<div class="figures">{cells}</div>')
    return "\n".join(out)


def verdict_section(cmp: dict[str, Any] | None) -> str:
    if cmp is None:
        return '<h2>Regression check</h2>\n<p class="muted">First run of its series: no baseline to compare with.</p>'
    verdict = str(cmp.get("verdict") or "unknown")
    color = VERDICT_COLORS.get(verdict, "#546e7a")
    delta = finite(cmp.get("mean_delta"))
    out = [
        "<h2>Regression check</h2>",
        f'<p><span class="badge" style="background:{color}">{_e(verdict.upper().replace("_", " "))}</span> '
        f"vs baseline <code>{_e(cmp.get('baseline_run_id'))}</code></p>",
        f"<p>mean delta <b>{_fmt(delta, '+.3f')}</b> "
        f"({_ci(cmp.get('ci_low'), cmp.get('ci_high'))}); mean {_fmt(cmp.get('mean_current'))} vs "
        f"{_fmt(cmp.get('mean_baseline'))} over {_e(cmp.get('n_paired'))} paired rows; "
        f"flips pass→fail {_e(cmp.get('flips_pass_to_fail'))}, fail→pass {_e(cmp.get('flips_fail_to_pass'))} "
        f"(McNemar p = {_fmt(cmp.get('mcnemar_p'), '.3g')})</p>",
    ]
    if cmp.get("reason"):
        out.append(f'<p class="warn">Incomparable: {_e(cmp.get("reason"))}</p>')
    elif cmp.get("like_for_like") is False:
        out.append('<p class="warn">Not like for like: judge, prompt, metric or dataset differ from the baseline.</p>')
    return "\n".join(out)


def drops_section(drops: list[dict[str, Any]]) -> str:
    """The paired rows that lost most against the baseline (id and question, the question cut at 160 characters),
    with the sentences their context no longer supports."""
    if not drops:
        return ""
    head = "<tr><th>row id</th><th>baseline → current</th><th>delta</th><th>lost sentences</th></tr>"
    body = []
    for d in drops:
        lost = d.get("lost") or []
        detail = '<ul class="miss">' + "".join(f"<li>{_clip(x, 400)}</li>" for x in lost) + "</ul>" if lost else DASH
        question = f'<br><span class="muted">{_clip(d["question"], 160)}</span>' if d.get("question") else ""
        body.append(
            f"<tr><td><code>{_e(d.get('row_id'))}</code>{question}</td>"
            f'<td class="num">{_fmt(d.get("score_baseline"))} → {_fmt(d.get("score_current"))}</td>'
            f'<td class="num err">{_fmt(d.get("delta"), "+.3f")}</td><td>{detail}</td></tr>'
        )
    return "<h2>Largest drops vs baseline</h2>\n<table>" + head + "".join(body) + "</table>"


def histogram_section(scores: np.ndarray, scale: float, figures: dict[str, Any]) -> str:
    valid = scores[np.isfinite(scores)]
    counts = np.zeros(BINS, dtype=int)
    if valid.size:
        idx = np.clip(np.floor(valid / scale * BINS + 1e-9), 0, BINS - 1).astype(int)
        counts = np.bincount(idx, minlength=BINS)
    width, height, left, top, bottom = 560, 200, 40, 14, 30
    plot_w, plot_h = width - left - 10, height - top - bottom
    peak, bw = max(int(counts.max()), 1), plot_w / BINS
    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    out += [
        f'<text x="{left - 4}" y="{y}" text-anchor="end">{n}</text>' for y, n in ((top + 4, peak), (top + plot_h, 0))
    ]
    for i, c in enumerate(counts):
        h = plot_h * int(c) / peak
        x, y = left + i * bw + 1, top + plot_h - h
        span = f"[{scale * i / BINS:.3g}, {scale * (i + 1) / BINS:.3g}{']' if i == BINS - 1 else ')'}"
        out.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" height="{h:.1f}">'
            f"<title>{span}: {int(c)} rows</title></rect>"
        )
        if c:
            out.append(f'<text x="{x + bw / 2 - 1:.1f}" y="{y - 2:.1f}" text-anchor="middle">{int(c)}</text>')
    out += [f'<text x="{left + i * bw:.1f}" y="{height - 6}" text-anchor="middle">{scale * i / BINS:.3g}</text>'
            for i in range(0, BINS + 1, 2)]  # fmt: skip
    out.append(f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}"/>')
    out.append(f'<text class="axis-label" x="{left + plot_w / 2:.0f}" y="{height}" text-anchor="middle">score</text>')
    out.append(f'<text class="axis-label" x="10" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 10 {top + plot_h / 2:.0f})">rows</text>')  # fmt: skip
    out.append("</svg>")
    note = f"{int(valid.size)} scored rows in {BINS} bins over [0, {scale:g}]; not shown: "
    note += f"{_e(figures['errors'])} errored, {_e(figures['skipped'])} skipped."
    return "<h2>Score distribution</h2>\n" + "\n".join(out) + f'\n<p class="muted">{note}</p>'


def round_ticks(lo: float, hi: float, most: int = 5) -> tuple[float, float, list[float]]:
    """An axis over ``[lo, hi]`` widened to round ticks: a step of 1, 2, 2.5 or 5 times a power of ten, at most
    ``most`` ticks (0, 0.25, 0.5, 0.75, 1 rather than 0.219, 0.438...). Returns the axis ends and the ticks."""
    span = hi - lo if hi > lo else max(abs(hi), 1.0)
    power = 10.0 ** math.floor(math.log10(span / (most - 1)))

    def count(step: float) -> int:
        return math.ceil(hi / step - 1e-9) - math.floor(lo / step + 1e-9) + 1

    step = next((m * power for m in (1, 2, 2.5, 5, 10) if count(m * power) <= most), 20 * power)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [round(k * step, 10) for k in range(first, max(last, first + 1) + 1)]
    return ticks[0], ticks[-1], ticks


def trend_section(series: list[dict[str, Any]], run_id: str) -> str:
    values = [v for r in series for k in ("mean_score", "ci_low", "ci_high") if (v := finite(r.get(k))) is not None]
    if not values:
        return '<h2>Trend</h2>\n<p class="muted">No scored runs of this dataset and metric to chart.</p>'
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.15, 0.02 * max(abs(hi), 1.0))
    y0, y1 = max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad
    top_score = max((s for r in series if (s := finite(r.get("scale"))) is not None and s > 0), default=1.0)
    y0, y1, ticks = round_ticks(y0, y1)
    if hi <= top_score:  # scores end at the scale (1.0): an axis above it shows values no run can have
        y1 = min(y1, top_score)
        ticks = [t for t in ticks if t <= y1 + 1e-12]
    width, height, left, top, bottom = 640, 260, 56, 12, 88
    plot_w, plot_h = width - left - 12, height - top - bottom
    step = plot_w / len(series)

    def y(v: float) -> float:
        return top + plot_h * (1 - (v - y0) / (y1 - y0))

    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for v in ticks:
        out.append(f'<line class="grid" x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')  # fmt: skip
    configs: dict[tuple[Any, ...], int] = {}
    lines: dict[int, list[str]] = {}
    marks: list[str] = []
    for i, r in enumerate(series):
        x, current = left + step * (i + 0.5), r["run_id"] == run_id
        k = configs.setdefault(_config_key(r), len(configs))
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        mean, ci_lo, ci_hi = finite(r.get("mean_score")), finite(r.get("ci_low")), finite(r.get("ci_high"))
        if ci_lo is not None and ci_hi is not None:
            marks.append(f'<line class="whisker" x1="{x:.1f}" y1="{y(ci_lo):.1f}" x2="{x:.1f}" y2="{y(ci_hi):.1f}"/>')
        if mean is not None:
            lines.setdefault(k, []).append(f"{x:.1f},{y(mean):.1f}")
            tip = f"{r['run_id']}: mean {mean:.3f}, {_ci(ci_lo, ci_hi)}, started {_when(r.get('started_at'))}"
            marks.append(
                f'<circle class="point{" current" if current else ""}" style="fill:{color}" cx="{x:.1f}" '
                f'cy="{y(mean):.1f}" r="{6 if current else 4}"><title>{_e(tip)}</title></circle>'
            )
        rid, ty = str(r["run_id"]), top + plot_h + 12
        name = str(r.get("label") or (rid if len(rid) <= 12 else f"{rid[:8]}…{rid[-6:]}"))  # date…suffix
        klass = ' class="current"' if current else ""
        out.append(f'<text{klass} x="{x:.1f}" y="{ty}" text-anchor="end" '
                   f'transform="rotate(-35 {x:.1f} {ty})">{_clip(name, 16)}</text>')  # fmt: skip
    for k, points in lines.items():
        if len(points) >= 2:  # one line per judge configuration: runs of different judges are never joined
            color = SERIES_COLORS[k % len(SERIES_COLORS)]
            out.append(f'<polyline class="line" style="stroke:{color}" points="{" ".join(points)}"/>')
    out += marks
    out.append(f'<text class="axis-label" x="12" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + plot_h / 2:.0f})">mean score</text>')  # fmt: skip
    out.append(f'<text class="axis-label" x="{left + plot_w / 2:.0f}" y="{height - 4}" text-anchor="middle">'
               "run (label), oldest first</text>")  # fmt: skip
    out.append("</svg>")
    legend = "".join(
        f'<span class="legend"><span class="swatch" style="background:{SERIES_COLORS[k % len(SERIES_COLORS)]}">'
        f"</span>{_e(_config_name(key))}</span>"
        for key, k in configs.items()
    )
    note = f"Last {len(series)} run(s) of this dataset and metric; mean with 95 % CI, this run highlighted."
    if len(configs) > 1:
        note += " One series per judge configuration: their scores are not comparable."
    return "<h2>Trend</h2>\n" + "\n".join(out) + f'\n<p class="muted">{legend}<br>{note}</p>'


def _config_key(run: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two runs' scores comparable, as far as the trend is concerned (see analysis/comparability.py)."""
    return tuple(run.get(k) for k in ("judge", "judge_model", "prompt_version", "threshold", "scale", "units"))


def _config_name(key: tuple[Any, ...]) -> str:
    judge, model, prompt, threshold, scale, units = key
    name = f"{model or judge or '?'} (prompt {prompt or '?'})"
    return name + (f", threshold {threshold:g}" if isinstance(threshold, int | float) else "")


def segments_section(rows: list[dict[str, Any]], deltas: dict[tuple[Any, Any], dict[str, Any]]) -> str:
    if not rows:
        return ""
    threshold = finite(rows[0].get("threshold"))
    at = f" (score ≥ {threshold:g})" if threshold is not None else ""
    head = f"<tr><th>column</th><th>value</th><th>rows</th><th>mean</th><th>CI</th><th>pass rate{at}</th>"
    head += "<th>vs baseline</th></tr>" if deltas else "</tr>"
    body = []
    for r in rows:
        value = "(null)" if r.get("segment_value") is None else r.get("segment_value")
        cells = (
            f'<td>{_e(r.get("segment_column"))}</td><td>{_e(value)}</td><td class="num">{_e(r.get("rows"))}</td>'
            f'<td class="num">{_fmt(r.get("mean_score"))}</td>'
            f'<td class="num">{_ci(r.get("ci_low"), r.get("ci_high"))}</td>'
            f'<td class="num">{_fmt(r.get("pass_rate"), ".1%")}</td>'
        )
        if deltas:
            d = deltas.get((r.get("segment_column"), r.get("segment_value")))
            delta = None if d is None else finite(d.get("mean_delta"))
            text = DASH if d is None else f"{_e(d.get('verdict'))} ({_fmt(delta, '+.3f')})"
            color = VERDICT_COLORS.get(str(d.get("verdict"))) if d and d.get("verdict") != "unchanged" else None
            style = f' style="color:{color};font-weight:600"' if color else ""
            cells += f'<td class="num"{style}>{text}</td>'
        body.append(f"<tr>{cells}</tr>")
    return "<h2>Segments</h2>\n<table>" + head + "".join(body) + "</table>"


def worst_section(rows: list[dict[str, Any]], has_input: bool) -> str:
    if not rows:
        return '<h2>Worst rows</h2>\n<p class="muted">No result rows for this run.</p>'
    head = "<tr><th>row id</th>" + ("<th>question</th>" if has_input else "") + "<th>score</th><th>detail</th></tr>"
    body = []
    for r in rows:
        if r.get("error") is not None:
            score, detail = '<span class="err">error</span>', f'<span class="err">{_clip(r["error"], 500)}</span>'
        else:
            score = "skipped" if finite(r.get("score")) is None and r.get("skipped") else _fmt(r.get("score"))
            detail = _row_detail(r)
        question = f"<td>{_clip(r.get('input') or '', 300)}</td>" if has_input else ""
        body.append(f"<tr><td><code>{_e(r.get('row_id'))}</code></td>{question}<td class=\"num\">{score}</td>"
                    f"<td>{detail}</td></tr>")  # fmt: skip
    return "<h2>Worst rows</h2>\n<table>" + head + "".join(body) + "</table>"


def _row_detail(row: dict[str, Any]) -> str:
    """Each sentence with the judge's verdict and reason, then the retrieved chunks (those cited marked)."""
    verdicts = row.get("verdicts") or []
    items = []
    cited: set[int] = set()
    for v in verdicts:
        ok = str(v.get("verdict")).lower() == "yes"
        ids = [int(i) for i in v.get("chunk_ids") or []]
        cited.update(ids)
        where = f" (chunk {', '.join(map(str, ids))})" if ok and ids else ""
        reason = f' <span class="muted">– {_clip(v.get("reason"), 200)}</span>' if v.get("reason") else ""
        mark = "✓" if ok else '<span class="err">✗</span>'
        items.append(f"<li>{mark} {_clip(v.get('statement'), 400)}{where}{reason}</li>")
    out = '<ul class="miss">' + "".join(items) + "</ul>" if items else ""
    if not items and row.get("reason"):
        out = f'<span class="muted">{_clip(row["reason"], 300)}</span>'
    chunks = row.get("chunks")
    if chunks:
        lis = "".join(f"<li{' class=used' if i in cited else ''}>{_clip(c, 300)}</li>" for i, c in enumerate(chunks, 1))
        out += f'<div class="muted">retrieved chunks:</div><ol class="chunks">{lis}</ol>'
    elif "chunks" in row and verdicts:
        out += '<div class="muted">retrieved chunks: not available (the dataset changed since, or contexts came from a '
        out += "retriever)</div>"
    return out or DASH


def document(title: str, sections: list[str]) -> str:
    """One HTML5 document: ``title``, the stylesheet inline, the non-empty ``sections`` in order."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        *sections,
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
