"""Datasets as JSON lines or CSV: read with pyarrow.json / pyarrow.csv into an in-memory Parquet file.

- The format: ``.jsonl``/``.ndjson``/``.json`` is JSON lines, ``.csv`` is CSV, ``.parquet``/``.pq`` Parquet; any
  other name is sniffed (``PAR1`` is Parquet, a first ``{`` JSON lines). Anything else is refused naming the
  formats read and how to convert.
- A text file is parsed whole and kept as Parquet bytes (one per file, a few cached), so every reader (footer
  checks, row groups, row ids) works unchanged. Large datasets belong in Parquet.
- CSV has no lists: the context column holds JSON text (``["chunk one", "chunk two"]``), decoded per cell; a cell
  that is not a JSON list of strings is one DatasetError naming file, row and column.
- CSV cells are type-inferred, but not those of the id and text roles (``text_columns``: ``row_id``, the question,
  reference and response, the id lists, each role's default names or its ``--column`` name): they are read as
  written, so ids ``001``, ``002``, ``010`` stay ``001``... (inferred, they were the integers 1, 2, 10 and joined a
  qrels or retrieval file by the wrong ids), and a question ``42`` is text. Pass-through columns are inferred.
- Any JSON lines file reads, whatever the length of its lines: Arrow parses in blocks (1 MiB) that must hold whole
  lines, so a file with a longer line is parsed again with blocks as long as its longest line.
- Text must be UTF-8 (Arrow's JSON reader does not check it: the bytes failed later, naming nothing): the first
  byte that is not is one DatasetError naming file, line, row and column (JSON lines) or file, row and column (a
  CSV text column), the text itself never quoted. A CSV pass-through column that is not UTF-8 stays binary.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np
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


def open_parquet(
    fs: Any, path: str, uri: str, fh: Any, json_columns: Iterable[str], text_columns: Iterable[str]
) -> pq.ParquetFile:
    """``fh`` (open on ``path``) as a ParquetFile: a text dataset is converted first (see the module docstring).

    ``json_columns``: CSV columns decoded from JSON text (the context); ``text_columns``: CSV columns read as
    text, never inferred (``io/columns.text_columns``)."""
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
    json_cols, text_cols = tuple(json_columns), tuple(text_columns)
    key = (path, info.get("size"), info.get("ETag") or info.get("mtime"), fmt, json_cols, text_cols)
    raw = _CACHE.get(key)
    if raw is None:
        table = _read_jsonl(fh, uri) if fmt == "jsonl" else _read_csv(fh, uri, json_cols, text_cols)
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


_JSONL = "JSON lines (one JSON object per line)"
#: Arrow's ReadOptions.block_size is a 32-bit integer: a line longer than this cannot be parsed
_MAX_BLOCK = 2**31 - 1


def _read_jsonl(fh: Any, uri: str) -> pa.Table:
    raw = fh.read()
    _check_utf8(raw, uri)
    try:
        return pjson.read_json(pa.BufferReader(raw))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        if "straddl" not in str(exc):
            raise _arrow_error(exc, uri, _JSONL) from None
    longest = _longest_line(raw)
    if longest + 1 > _MAX_BLOCK:
        raise DatasetError(f"not readable as {_JSONL}: a line of {longest} bytes is longer than 2 GiB", uri=uri)
    try:  # a line longer than a block: again, in blocks that hold the longest line
        return pjson.read_json(pa.BufferReader(raw), read_options=pjson.ReadOptions(block_size=longest + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _arrow_error(exc, uri, _JSONL) from None


def _longest_line(raw: bytes, step: int = 1 << 26) -> int:
    """The length in bytes of ``raw``'s longest line (its end of line included), read 64 MiB at a time."""
    longest, start = 0, 0
    for base in range(0, len(raw), step):
        ends = np.flatnonzero(np.frombuffer(raw, np.uint8, min(step, len(raw) - base), base) == 10) + base
        if len(ends):
            longest = max(longest, int(ends[0]) + 1 - start, int(np.diff(ends).max(initial=0)))
            start = int(ends[-1]) + 1
    return max(longest, len(raw) - start)


def _valid_utf8(raw: bytes) -> bool:
    """``raw`` is UTF-8 (checked by Arrow on the bytes as they are: no copy, no decoded text)."""
    offsets = pa.py_buffer(np.array([0, len(raw)], np.int64).tobytes())
    text = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(raw)])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _check_utf8(raw: bytes, uri: str) -> None:
    """A JSON lines file whose bytes are not all UTF-8: one DatasetError naming its file, line, row and column."""
    if _valid_utf8(raw):
        return
    try:
        raw.decode("utf-8")
        return  # pragma: no cover - Arrow and Python agree on what UTF-8 is
    except UnicodeDecodeError as exc:
        at = exc.start
    start = raw.rfind(b"\n", 0, at) + 1
    end = raw.find(b"\n", at)
    line = raw[start : len(raw) if end < 0 else end]
    before = raw[:start].split(b"\n")[:-1]
    row = sum(1 for b in before if b.strip())  # Arrow skips blank lines: the row is the objects before it
    raise DatasetError(
        f"not UTF-8 text: line {len(before) + 1} has byte 0x{raw[at]:02x} (its byte {at - start + 1}), which UTF-8 "
        "does not allow; JSON lines are UTF-8: save the file as UTF-8",
        uri=uri,
        row=row,
        column=_key_holding(line),
    )


def _key_holding(line: bytes) -> str | None:
    """The key of the JSON object on ``line`` whose name or value holds the byte that is not UTF-8."""
    try:
        value = json.loads(line.decode("utf-8", errors="surrogateescape"))
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    for key, item in value.items():
        if _escaped(key) or _escaped(item):
            return str(key).encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    return None


def _escaped(value: Any) -> bool:
    """``value`` (decoded JSON) holds a byte that was not UTF-8 (a surrogate of ``surrogateescape``)."""
    if isinstance(value, str):
        return any("\udc80" <= c <= "\udcff" for c in value)
    if isinstance(value, list):
        return any(_escaped(v) for v in value)
    if isinstance(value, dict):
        return any(_escaped(k) or _escaped(v) for k, v in value.items())
    return False


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


def _read_csv(fh: Any, uri: str, json_columns: tuple[str, ...], text_columns: tuple[str, ...]) -> pa.Table:
    texts = dict.fromkeys([*text_columns, *json_columns])
    try:  # the text columns as bytes, made text here: Arrow's own check says neither row nor column
        table = pcsv.read_csv(fh, convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(texts, pa.binary())))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _csv_error(exc, fh, uri) from None
    for name in texts:
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, name, _utf8(table.column(i), uri, name))
    for name in json_columns:
        if name not in table.column_names:
            continue
        values: list[list[str | None] | None] = []
        for row, cell in enumerate(table.column(name).cast(pa.string()).to_pylist()):
            values.append(_json_list(cell, uri, row, name))
        table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.list_(pa.string())))
    return table


def _utf8(column: pa.ChunkedArray, uri: str, name: str) -> pa.ChunkedArray:
    """A CSV column read as bytes, as text; the first cell that is not UTF-8 is a DatasetError (row and column)."""
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    for row, cell in enumerate(column.to_pylist()):
        try:
            (cell or b"").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(
                f"not UTF-8 text: the cell has byte 0x{cell[exc.start]:02x} (its byte {exc.start + 1}), which UTF-8 "
                "does not allow; save the file as UTF-8",
                uri=uri, row=row, column=name,
            ) from None  # fmt: skip
    return column.cast(pa.string())  # pragma: no cover - Arrow and Python agree on what UTF-8 is


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
