"""Datasets as JSON lines or CSV: read with pyarrow.json / pyarrow.csv into an in-memory Parquet file.

- The format: ``.jsonl``/``.ndjson``/``.json`` is JSON lines, ``.csv`` is CSV, ``.parquet``/``.pq`` Parquet; any
  other name is sniffed (``PAR1`` is Parquet, a first ``{`` JSON lines). Anything else is refused naming the
  formats read and how to convert.
- A text file is parsed whole and kept as Parquet bytes (one per file, a few cached), so every reader (footer
  checks, row groups, row ids) works unchanged. Large datasets belong in Parquet.
- CSV has no lists: the context column holds JSON text (``["chunk one", "chunk two"]``), decoded per cell; a cell
  that is not a JSON list of strings is one DatasetError naming file, row and column.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError, one_line

TEXT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv")
EXPECTED = (
    "a dataset is Parquet (.parquet), JSON lines (.jsonl/.ndjson, one object per line) or CSV (.csv, the context "
    "column as JSON text); convert others with pandas, e.g. pandas.read_excel(f).to_parquet('data.parquet')"
)
_ROWS_PER_GROUP = 10_000
_CACHE: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_CACHE_FILES = 4


def text_format(path: str, head: bytes) -> str | None:
    """``"jsonl"``, ``"csv"``, or None for Parquet (by extension, else sniffed from the first bytes)."""
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")) or head[:4] == b"PAR1":
        return None
    if lower.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if lower.endswith(".csv"):
        return "csv"
    if head.lstrip()[:1] == b"{":
        return "jsonl"
    return None


def open_parquet(fs: Any, path: str, uri: str, fh: Any, json_columns: Iterable[str]) -> pq.ParquetFile:
    """``fh`` (open on ``path``) as a ParquetFile: a text dataset is converted first (see the module docstring)."""
    head = fh.read(4096)
    fh.seek(0)
    fmt = text_format(path, head)
    if fmt is None:
        if head[:4] != b"PAR1" and not path.lower().endswith((".parquet", ".pq")):
            raise DatasetError(
                f"not a readable Parquet file, JSON lines or CSV (it starts with neither PAR1 nor {{); {EXPECTED}",
                uri=uri,
            )
        return pq.ParquetFile(fh)
    info = fs.info(path)
    key = (path, info.get("size"), info.get("ETag") or info.get("mtime"), fmt, tuple(json_columns))
    raw = _CACHE.get(key)
    if raw is None:
        table = _read_jsonl(fh, uri) if fmt == "jsonl" else _read_csv(fh, uri, key[-1])
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=_ROWS_PER_GROUP)
        raw = sink.getvalue().to_pybytes()
        _CACHE[key] = raw
        while len(_CACHE) > _CACHE_FILES:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return pq.ParquetFile(pa.BufferReader(raw))


def _arrow_error(exc: Exception, uri: str, what: str, text: str | None = None) -> DatasetError:
    text = one_line(exc, empty="") if text is None else text
    row = re.search(r"in row (\d+)", text)
    column = re.search(r"Column\(/([^)]*)\)", text)
    return DatasetError(
        f"not readable as {what}: {text}",
        uri=uri,
        row=int(row.group(1)) if row else None,
        column=column.group(1) if column else None,
    )


def _read_jsonl(fh: Any, uri: str) -> pa.Table:
    try:
        return pjson.read_json(fh)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _arrow_error(exc, uri, "JSON lines (one JSON object per line)") from None


_FIELD_COUNT = re.compile(r"Expected (\d+) columns, got (\d+)")
_QUOTED = re.compile(r"'([^']{40})[^']*'")


def _csv_error(exc: Exception, fh: Any, uri: str) -> DatasetError:
    """A CSV that does not parse, by line and field counts: Arrow's message quotes the line itself (a file read by
    mistake may hold secrets), so that part is dropped and a value it quotes is cut to 40 characters."""
    text = one_line(exc, empty="")
    counts = _FIELD_COUNT.search(text)
    if counts is None:
        return _arrow_error(exc, uri, "CSV", _QUOTED.sub(r"'\1'...", text))
    expected, got = counts.groups()
    lines: list[int] = []

    def record(row: Any) -> str:
        if row.number is not None and row.number > 0:
            lines.append(int(row.number))
        return "error"

    try:  # again, one thread: only then does Arrow count the lines
        fh.seek(0)
        pcsv.read_csv(fh, read_options=pcsv.ReadOptions(use_threads=False),
                      parse_options=pcsv.ParseOptions(invalid_row_handler=record))  # fmt: skip
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        pass
    where = f"line {lines[0]} has" if lines else "a line has"
    return DatasetError(
        f"not readable as CSV: {where} {got} field{'s' if got != '1' else ''}, expected {expected} (as the header)",
        uri=uri,
    )


def _read_csv(fh: Any, uri: str, json_columns: tuple[str, ...]) -> pa.Table:
    try:
        table = pcsv.read_csv(fh)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _csv_error(exc, fh, uri) from None
    for name in json_columns:
        if name not in table.column_names:
            continue
        values: list[list[str | None] | None] = []
        for row, cell in enumerate(table.column(name).cast(pa.string()).to_pylist()):
            values.append(_json_list(cell, uri, row, name))
        table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.list_(pa.string())))
    return table


def _json_list(cell: str | None, uri: str, row: int, column: str) -> list[str | None] | None:
    if cell is None or not cell.strip():
        return None
    try:
        value = json.loads(cell)
    except ValueError:
        value = cell
    if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
        raise DatasetError(
            f'a list column in CSV is JSON text, a list of strings (["chunk one", "chunk two"]); found {cell[:40]!r}',
            uri=uri,
            row=row,
            column=column,
        )
    return value
