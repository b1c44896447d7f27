"""Printing rows for people and for scripts: ``--output-format table|csv|json|markdown``.

Decisions:

* Every printed value passes through the secret redactor (:func:`recall_tasks.secrets.redact`), whatever the
  format: ``query`` prints what analysts' SQL returns, and that must never show a key. Only values that look
  like secrets are masked (``LocalStack``'s ``test`` is not one: the data keeps its words), and a listing that
  masked something says so on stderr ("3 values held a secret, shown as ***").
* Data is never read as Rich markup: cells, headers and titles are :class:`rich.text.Text`, so ``arr[i]`` prints
  as is and ``[/]`` cannot raise ``MarkupError``.
* Data never drives the terminal: a ``table`` (for people, wherever it goes) shows every control character but
  line breaks and tabs as an escape (``\x1b[2J``, :func:`recall_tasks._logging.inert`); ``csv`` and ``markdown``
  do too when written to a terminal, and ``json`` there escapes DEL and the C1 controls (``\u009b``) that JSON
  leaves raw (it escapes the rest itself). Written to a pipe or a file, csv, markdown and json keep the exact
  bytes (an export is the data), but for csv's formula-like text cells (below).
* ``table`` on a terminal fits the terminal and folds long values (never ``…``); piped (stdout not a terminal)
  it is rendered at the width its widest values need, so every value is printed in full, one row per line
  unless a value holds a newline.
* ``json`` is JSON lines: one object per row (dates in ISO 8601, NaN as null), for ``jq`` and scripts.
* ``csv`` and ``markdown`` print lists and structs as JSON text; markdown escapes ``|``, newlines and HTML.
* ``csv`` is opened in spreadsheets, which run a cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a CR as a
  formula (CWE-1236: ``=HYPERLINK(…)`` sends data away, DDE runs commands). Such a text cell, the header's too, is
  written with a ``'`` in front (OWASP's advice; :func:`sheet_cell`), wherever the csv goes: a file or a pipe is
  opened by people as well. Numbers (ints, floats, decimals) are never touched (``-0.25`` in a numeric column
  stays a number); a text cell that is a plain decimal number (``-0.25``, ``+3``, ``1e-5``) is kept too: a spreadsheet
  reads the number and nothing runs. ``--raw-cells`` (``raw_cells``) keeps the exact text, for programs.
* A listing cut by ``--limit`` says so on stderr ("50 of 300 rows shown; --limit 0 for all"), never silently.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Literal, get_args
from urllib.parse import urlsplit

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from recall_tasks._logging import inert
from recall_tasks.secrets import MASK, redact, redactor

__all__ = [
    "OUTPUT_FORMATS", "OutputFormat", "cut_notice", "json_value", "judge_line", "print_rows", "sheet_cell", "text",
]  # fmt: skip

OutputFormat = Literal["table", "csv", "json", "markdown"]
OUTPUT_FORMATS: tuple[str, ...] = get_args(OutputFormat)


Mask = Callable[[str], str]


def json_value(value: Any, mask: Mask = redact) -> Any:
    """``value`` as JSON-ready data with every string (keys too) redacted by ``mask``, recursively.

    Timestamps become ISO 8601, decimals strings, bytes hex, NaN and infinities null; types are tested exactly
    first because a ``--limit 0`` export calls this for every value.
    """
    kind = type(value)
    if kind is str:
        return mask(value)
    if value is None or kind is int or kind is bool:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is list or kind is tuple:
        return [json_value(v, mask) for v in value]
    if isinstance(value, Mapping):
        return {mask(str(k)): json_value(v, mask) for k, v in value.items()}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [json_value(v, mask) for v in value]
    return mask(str(value))


def text(value: Any, mask: Mask = redact) -> str:
    """One value as redacted display text: ``""`` for null, JSON for lists and structs, ISO 8601 timestamps."""
    if value is None:
        return ""
    if type(value) is str:
        return mask(value)
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(json_value(value, mask), ensure_ascii=False)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return mask(str(value))


def shown(value: Any, mask: Mask = redact) -> str:
    """:func:`text` for people: floats rounded (4 decimals, 3 significant digits below 0.001); JSON and CSV keep all."""
    if type(value) is float and math.isfinite(value) and value != 0:
        if abs(value) < 0.001:
            return f"{value:.3g}"
        rounded = f"{value:.4f}".rstrip("0")
        return rounded + "0" if rounded.endswith(".") else rounded
    return text(value, mask)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NUMBERS = (int, float, decimal.Decimal)


def sheet_cell(cell: str) -> str:
    """A csv text cell a spreadsheet shows as text: ``'`` before a formula-like start (module docstring)."""
    if cell.startswith(_FORMULA_START) and _PLAIN_NUMBER.fullmatch(cell) is None:
        return "'" + cell
    return cell


def _csv_cells(values: Sequence[Any], mask: Mask, raw: bool) -> list[str]:
    if raw:
        return [text(v, mask) for v in values]
    return [text(v, mask) if isinstance(v, _NUMBERS) else sheet_cell(text(v, mask)) for v in values]


def _markdown_cell(value: str) -> str:
    value = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def width_needed(columns: Sequence[str], cells: list[list[str]]) -> int:
    """Console width at which a boxed table shows every cell on one line (per line of a multi-line cell)."""
    widths = [cell_len(c) for c in columns]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], max((cell_len(line) for line in cell.splitlines()), default=0))
    return sum(widths) + 3 * len(widths) + 1


def print_table(
    columns: Sequence[str],
    cells: list[list[str]],
    console: Console,
    *,
    title: str | None = None,
    show_header: bool = True,
    keep_whole: Iterable[str] = (),
) -> None:
    """A Rich table of plain-text cells (never markup). ``keep_whole``: columns never wrapped (run ids)."""
    whole = set(keep_whole)
    columns = [inert(c) for c in columns]
    cells = [[inert(c) for c in row] for row in cells]
    title = inert(title) if title is not None else None
    piped = not console.is_terminal
    if piped:
        # wide enough for the longest values: nothing wrapped, nothing cut
        console = Console(
            file=console.file, width=max(80, width_needed(columns, cells)), color_system=None, highlight=False,
            emoji=False,
        )  # fmt: skip
    table = Table(title=Text(title) if title is not None else None, show_header=show_header)
    for i, name in enumerate(columns):
        keep = piped or name in whole
        width = max([cell_len(name), *(cell_len(r[i]) for r in cells)]) if name in whole else None
        table.add_column(Text(name), overflow="fold", no_wrap=keep, min_width=width)
    for row in cells:
        table.add_row(*(Text(c) for c in row))
    console.print(table, soft_wrap=False)


def print_rows(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    fmt: OutputFormat,
    console: Console,
    *,
    title: str | None = None,
    keep_whole: Iterable[str] = (),
    file: IO[str] | None = None,
    raw_cells: bool = False,
) -> int:
    """Print ``rows`` (sequences in ``columns`` order) in ``fmt``, values redacted first; the number printed.

    ``console`` renders ``table`` (which needs every row to size its columns); the other formats stream plain
    text to ``file`` (default: stdout) a row at a time. ``raw_cells``: csv text cells exactly as they are, a
    formula-like start included (``--raw-cells``; by default :func:`sheet_cell`).
    """
    out = file if file is not None else sys.stdout
    mask = redactor()  # the secrets looked up once, not once per value
    tty = _is_terminal(out)
    names = [mask(c) for c in columns]
    count = 0
    if fmt == "json":
        for row in rows:
            record = {name: json_value(v, mask) for name, v in zip(names, row, strict=True)}
            line = json.dumps(record, ensure_ascii=False)
            out.write((_C1.sub(_json_escape, line) if tty else line) + "\n")
            count += 1
        _say_masked(mask.masked)
        return count
    if fmt == "csv":
        cells = (_csv_cells(row, mask, raw_cells) for row in rows)
        names = names if raw_cells else [sheet_cell(n) for n in names]
    else:
        cells = ([shown(v, mask) for v in row] for row in rows)
    if tty and fmt != "table":  # the table is made inert in print_table
        cells = ([inert(c) for c in row] for row in cells)
        names = [inert(n) for n in names]
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        for row_cells in cells:
            writer.writerow(row_cells)
            count += 1
    elif fmt == "markdown":
        out.write("| " + " | ".join(_markdown_cell(n) for n in names) + " |\n")
        out.write("|" + "---|" * len(names) + "\n")
        for row_cells in cells:
            out.write("| " + " | ".join(_markdown_cell(c) for c in row_cells) + " |\n")
            count += 1
    else:
        every = list(cells)
        print_table(names, every, console, title=title, keep_whole=keep_whole)
        count = len(every)
    _say_masked(mask.masked)
    return count


def _say_masked(masked: int) -> None:
    if masked:
        sys.stdout.flush()  # after the rows it is about, on a terminal showing both
        sys.stderr.write(f"{masked} value{'s' if masked > 1 else ''} held a secret, shown as {MASK}\n")


_C1 = re.compile(r"[\x7f-\x9f]")  # what json.dumps(ensure_ascii=False) leaves raw of the control characters


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def _is_terminal(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without isatty
        return False


def cut_notice(shown: int, total: int) -> str | None:
    """What to say on stderr when a listing is cut by ``--limit``; ``None`` when nothing was left out."""
    if shown >= total:
        return None
    return f"{shown} of {total} rows shown; --limit 0 for all"


def judge_line(judge: str, model: str, base_url: str | None) -> str:
    """The first line of a run, on stderr: which judge produces the numbers (host only, never credentials)."""
    if judge == "lexical":
        return "judge: lexical (offline approximation; use --judge openai for numbers you report)"
    from recall_tasks.settings import settings

    url = base_url or settings().openai_base_url or "https://api.openai.com/v1"
    parts = urlsplit(url)
    host = parts.hostname or url
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"judge: {judge} {model} at {host}"


HISTORY_COLUMNS = (
    "started", "dataset", "label", "run_id", "status", "judge", "rows", "mean", "95 % CI", "pass rate", "verdict",
)  # fmt: skip
HISTORY_FIELDS = (
    "started_at", "dataset", "label", "run_id", "status", "judge", "rows", "mean_score", "ci_low", "ci_high",
    "pass_rate", "threshold", "verdict", "baseline_run_id", "reason",
)  # fmt: skip


def history_records(runs: Any, comparisons: Any | None) -> list[dict[str, Any]]:
    """One record per run (overall rows only), oldest first, with its status and its verdict against its baseline.

    ``runs``/``comparisons`` are pyarrow tables. The comparisons table's ``reason`` column (why a pair is
    ``incomparable``) is optional: outputs written before it existed have none. A run without a comparison gets,
    as its ``reason``, why not: ``not compared (failed run)``, ``first run of its series``, ``no comparable
    baseline (N earlier runs: …)`` when every earlier run of its series failed or was stopped by a budget, else
    ``not compared``.
    """
    verdicts: dict[str, dict[str, Any]] = {}
    if comparisons is not None:
        for c in comparisons.to_pylist():  # an id metric's row ("recall@10", issue 41) is not the run's verdict
            if c.get("segment_column") is None and "@" not in str(c.get("metric") or ""):
                verdicts[c["current_run_id"]] = c
    records = []
    for r in runs.to_pylist():
        if r.get("segment_column") is not None:
            continue
        c = verdicts.get(r["run_id"], {})
        records.append(
            {
                "started_at": r["started_at"],
                "dataset": r["dataset"],
                "label": r["label"],
                "run_id": r["run_id"],
                "status": r.get("status"),
                "judge": r.get("judge_model"),
                "rows": r["rows"],
                "mean_score": r["mean_score"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "pass_rate": r["pass_rate"],
                "threshold": r.get("threshold"),
                "verdict": c.get("verdict"),
                "baseline_run_id": c.get("baseline_run_id"),
                "reason": c.get("reason"),
            }
        )
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    order = sorted(range(len(records)), key=lambda i: records[i]["started_at"] or epoch)
    series = [_series_keys(r) for r in runs.to_pylist() if r.get("segment_column") is None]
    _explain_missing_verdicts([records[i] for i in order], [series[i] for i in order])
    return [records[i] for i in order]


def _series_keys(run: Mapping[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A run's series as ``baseline.find_baseline`` has it: its dataset id, else its dataset name (and metric)."""
    metric = run.get("metric")
    by_name = ("name", run.get("dataset"), metric)
    return (("id", run["dataset_id"], metric) if run.get("dataset_id") else by_name), by_name


def _explain_missing_verdicts(records: list[dict[str, Any]], series: list[tuple[tuple[Any, ...], ...]]) -> None:
    """Fill ``reason`` of the runs with no verdict (oldest first): why they have none (see history_records)."""
    from recall_tasks.analysis.baseline import no_baseline_text

    seen: dict[tuple[Any, ...], dict[str, int]] = {}  # statuses so far per series key (id-less runs by name too)
    for rec, (key, by_name) in zip(records, series, strict=True):
        if rec["verdict"] is None:
            earlier = dict(seen.get(key, {}))
            if key != by_name:  # runs recorded before dataset_id existed belong to every id of that name
                for status, n in seen.get(("legacy", *by_name[1:]), {}).items():
                    earlier[status] = earlier.get(status, 0) + n
            if rec["status"] == "failed":
                rec["reason"] = "not compared (failed run)"
            else:
                rec["reason"] = no_baseline_text(earlier) or "not compared"
        status = rec["status"] or "completed"
        for k in (by_name, key if key != by_name else ("legacy", *by_name[1:])):
            counts = seen.setdefault(k, {})
            counts[status] = counts.get(status, 0) + 1


def history_cells(rec: Mapping[str, Any]) -> list[str]:
    """A history record as the human columns of :data:`HISTORY_COLUMNS` (table and markdown formats)."""

    def num(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    ci = "-" if rec["ci_low"] is None else f"{rec['ci_low']:.3f}..{rec['ci_high']:.3f}"
    if rec["verdict"] is None:
        why = rec.get("reason") or "first run of its series"
        verdict = "first of series" if why == "first run of its series" else why
    else:
        verdict = f"{rec['verdict']} vs {rec['baseline_run_id']}"
        if rec["verdict"] == "incomparable" and rec.get("reason"):
            verdict += f": {_short_reason(rec['reason'])}"
    started = rec["started_at"].strftime("%Y-%m-%d %H:%M") if rec["started_at"] else ""
    return [
        started, text(rec["dataset"]), text(rec["label"]), rec["run_id"], text(rec.get("status")), text(rec["judge"]),
        text(rec["rows"]),
        num(rec["mean_score"], ".3f"), ci, pass_rate_text(rec["pass_rate"], rec.get("threshold")), verdict,
    ]  # fmt: skip


_REASON_CHARS = 60


def _short_reason(reason: str) -> str:
    """Whole reasons up to ~60 characters, then how many more (the table stays readable; json has them all)."""
    parts = reason.split("; ")
    kept: list[str] = []
    for part in parts:
        if kept and len("; ".join([*kept, part])) > _REASON_CHARS:
            break
        kept.append(part if len(part) <= _REASON_CHARS else part[: _REASON_CHARS - 1] + "…")
    more = len(parts) - len(kept)
    return "; ".join(kept) + (f"; +{more} more (--output-format json)" if more else "")


def pass_rate_text(rate: float | None, threshold: float | None) -> str:
    """``100.0% ≥0.5``: the share of rows scoring at or above the threshold, with the threshold beside it."""
    if rate is None:
        return "-"
    return f"{rate:.1%}" + (f" ≥{threshold:g}" if threshold is not None else "")
