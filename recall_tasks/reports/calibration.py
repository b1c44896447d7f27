"""The report of a calibration (``recall-bench calibrate``): plain text for the console, Markdown and HTML files.

One content, three renderings: :func:`blocks` lays the calibration out as headings, paragraphs and tables (the
judges side by side, then per judge its confusion matrix, figures per task and category, the rows left out and
the disagreements with the judge's reason); :func:`render_text`, :func:`render_markdown` and :func:`render_html`
render them. Dataset text is escaped in Markdown (``reports/markdown.py``) and HTML (``html.escape``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from recall_tasks.analysis.agreement import Agreement, Figure, interval_note
from recall_tasks.analysis.calibration import Calibration, JudgeCalibration
from recall_tasks.io.storage import join_uri, translate_storage_error
from recall_tasks.reports.markdown import md_text

__all__ = ["blocks", "render_html", "render_markdown", "render_text", "write_reports"]

_NAMES = {"accuracy": "accuracy", "kappa": "kappa", "tpr": "TPR", "tnr": "TNR", "mae": "MAE", "spearman": "Spearman"}


@dataclass
class Block:
    kind: str  # "h1" | "h2" | "h3" | "p" | "table"
    text: str = ""
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


def fig(f: Figure) -> str:
    """``0.812 [0.750, 0.869]``, ``0.812 [no interval]`` below the rows an interval needs, ``n/a`` when
    undefined."""
    if f.value is None:
        return "n/a"
    if f.low is None or f.high is None:
        return f"{f.value:.3f} [no interval]"
    return f"{f.value:.3f} [{f.low:.3f}, {f.high:.3f}]"


def _cost(j: JudgeCalibration) -> str:
    if j.cost_usd is None:
        return "unknown (no price for the model)"
    return f"${j.cost_usd:.4f}"


def _figure_rows(label: str, a: Agreement) -> tuple[str, ...]:
    return (label, str(a.rows), str(a.units), *(fig(f) for f in a.figures().values()))


def blocks(cal: Calibration, disagreements: int | None = None) -> list[Block]:
    """The report's content; ``disagreements``: list at most this many per judge (None: all)."""
    s = cal.labelled
    out = [
        Block("h1", f"Calibration of {len(cal.judges)} judge(s) on {s.name}"),
        Block(
            "p",
            f"Labelled set {s.uri} ({len(s.rows)} rows, {s.units} labelled units, {', '.join(s.tasks())}; "
            f"fingerprint {s.fingerprint}). Calibration {cal.calibration_id} at "
            f"{cal.calibrated_at.strftime('%Y-%m-%d %H:%M:%S UTC')}. Intervals: 95 % bootstrap over rows "
            f"({cal.judges[0].overall.resamples if cal.judges else 0} resamples, seed "
            f"{cal.judges[0].overall.seed if cal.judges else 0}); positive = supported.",
        ),
    ]
    figure_headers = ("rows", "units", *(_NAMES[n] for n in _NAMES))
    out.append(
        Block(
            "table",
            headers=("judge", "status", *figure_headers, "requests", "tokens (in/out)", "cost"),
            rows=tuple(
                (
                    j.spec.name,
                    j.status if not j.row_errors else f"failed: {len(j.row_errors)} row(s) without verdicts",
                    *_figure_rows("", j.overall)[1:],
                    str(j.requests) + (f" ({j.cached} rows cached)" if j.cached else ""),
                    f"{j.prompt_tokens}/{j.completion_tokens}",
                    _cost(j),
                )
                for j in cal.judges
            ),
        )
    )
    for j in cal.judges:
        c = j.overall.confusion
        out.append(Block("h2", f"{j.spec.name} ({j.judge_model}, prompt {j.prompt_version})"))
        out.append(
            Block(
                "table",
                headers=("", "judge: supported", "judge: not supported"),
                rows=(("human: supported", str(c.tp), str(c.fn)), ("human: not supported", str(c.fp), str(c.tn))),
            )
        )
        undefined = [f"{_NAMES[f.name]}: {f.reason}" for f in j.overall.figures().values() if f.value is None]
        if undefined:
            out.append(Block("p", "Undefined: " + "; ".join(undefined) + "."))
        no_interval = interval_note(j.overall)
        if no_interval:
            out.append(Block("p", f"No intervals: {no_interval}."))
        segments = [(f"task {t}", a) for t, a in j.by_task.items()] if len(j.by_task) > 1 else []
        segments += [(f"category {k}", a) for k, a in j.by_category.items()]
        if segments:
            out.append(Block("h3", "By task and category"))
            out.append(Block("table", headers=("segment", *figure_headers), rows=tuple(
                _figure_rows(label, a) for label, a in segments)))  # fmt: skip
        if j.row_errors:
            out.append(Block("h3", f"Rows without verdicts ({len(j.row_errors)}), left out of the figures"))
            out.append(Block("table", headers=("row", "why"), rows=tuple((k, e) for k, e in j.row_errors)))
        shown = j.disagreements if disagreements is None else j.disagreements[:disagreements]
        title = f"Disagreements ({len(j.disagreements)})"
        if len(shown) < len(j.disagreements):
            title += f", the first {len(shown)} (all in the report files and the calibrations table)"
        out.append(Block("h3", title))
        if shown:
            out.append(
                Block(
                    "table",
                    headers=("row", "category", "unit", "human", "judge", "judge's reason"),
                    rows=tuple(
                        (d.row_key, d.category or "", d.unit, _word(d.human), _word(d.judge), d.reason) for d in shown
                    ),
                )
            )
        else:
            out.append(Block("p", "None: the judge agrees with every label."))
    return out


def _word(supported: bool) -> str:
    return "supported" if supported else "not supported"


def render_text(items: list[Block]) -> str:
    """For the console: headings underlined, tables in aligned columns (cells cut at 80 characters)."""
    lines: list[str] = []
    for b in items:
        if b.kind in ("h1", "h2", "h3"):
            lines += ["", b.text, {"h1": "=", "h2": "-", "h3": "."}[b.kind] * min(len(b.text), 100)]
        elif b.kind == "p":
            lines += ["", b.text]
        else:
            cells = [b.headers, *[tuple(_cut(c) for c in r) for r in b.rows]]
            widths = [max(len(r[i]) for r in cells) for i in range(len(b.headers))]
            lines.append("")
            for n, r in enumerate(cells):
                lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
                if n == 0:
                    lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines).lstrip("\n") + "\n"


def _cut(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_markdown(items: list[Block]) -> str:
    lines: list[str] = []
    for b in items:
        if b.kind in ("h1", "h2", "h3"):
            lines += [f"{'#' * int(b.kind[1])} {md_text(b.text)}", ""]
        elif b.kind == "p":
            lines += [md_text(b.text), ""]
        else:
            lines.append("| " + " | ".join(md_text(h) for h in b.headers) + " |")
            lines.append("|" + "---|" * len(b.headers))
            lines += ["| " + " | ".join(md_text(c) for c in r) + " |" for r in b.rows]
            lines.append("")
    return "\n".join(lines)


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f4f4f4}"
)


def render_html(items: list[Block]) -> str:
    """A self-contained HTML page (no script, no external resource)."""
    body: list[str] = []
    title = ""
    for b in items:
        if b.kind in ("h1", "h2", "h3"):
            title = title or b.text
            body.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            body.append(f"<p>{html.escape(b.text)}</p>")
        else:
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_reports(store: Any, cal: Calibration) -> list[str]:
    """``<output>/reports/<calibration id>.md`` and ``.html``; their URIs."""
    items = blocks(cal)
    uris = []
    for suffix, document in (("md", render_markdown(items)), ("html", render_html(items))):
        path = store.path("reports", f"{cal.calibration_id}.{suffix}")
        uri = join_uri(store.output_uri, "reports", f"{cal.calibration_id}.{suffix}")
        try:
            store.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with store.fs.open(path, "w") as fh:
                fh.write(document)
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, uri) from None
        uris.append(uri)
    return uris
