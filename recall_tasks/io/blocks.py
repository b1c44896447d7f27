"""A dataset's rows, as blocks: streamed one row group at a time, with stable row ids and content hashes.

- :func:`iter_blocks` reads one row group at a time (``ParquetFile.read_row_group`` with only the needed
  columns) and cuts it into blocks of at most ``--chunk-size`` rows; the whole dataset is never in memory.
  :func:`read_block` re-reads one of those blocks (worker processes), :func:`read_contexts` a few rows' contexts
  (reports).
- Row ids: the ``row_id`` column, else :func:`identity_hash` of the question and the reference answer with
  ``~2``, ``~3``... suffixes for exact duplicates in dataset order (``io/datasets.py``, "Row identity").
  :func:`content_hash` (every judged field) is the key of the verdict caches.
- Role columns are cast to ``string``/``list<string>`` under their role names; pass-through columns to their
  stored type (``io/columns.stored_type``).
- A data page that cannot be decoded is found here, when its row group is read: one DatasetError naming the
  file, row group and rows.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError
from recall_tasks.io.datasets import Dataset, DatasetFile, one_line
from recall_tasks.io.storage import translate_storage_error
from recall_tasks.io.textfiles import open_parquet


@dataclass
class RowBlock:
    """A slice of rows, already mapped to roles, with stable row ids and content hashes."""

    source: str
    first_row: int  # 0-based index of the block's first row within its file
    row_ids: list[str]
    content_hashes: list[str]
    table: pa.Table  # role columns under role names + pass-through columns


def content_hash(values: tuple[Any, ...]) -> str:
    """Stable hash of a row's judged content (question, expected, context, answer).

    Each value is tagged (``\0N`` null, ``\0S`` string, ``\0L`` list then ``\0I`` per item) so that no two
    different rows give the same byte stream; the stream is built as one string and hashed in one call.
    """
    parts: list[str] = []
    for v in values:
        if v is None:
            parts.append("\x00N")
        elif isinstance(v, list):
            parts.append("\x00L")
            for item in v:
                parts.append("\x00I")
                parts.append(item if type(item) is str else str(item))
        else:
            parts.append("\x00S")
            parts.append(v if type(v) is str else str(v))
    return hashlib.blake2b("".join(parts).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def identity_hash(question: str | None, expected: str | None) -> str:
    """A row's id without a ``row_id`` column: question and reference answer only (``ROW_IDENTITY``)."""
    return content_hash(("\x00identity/v2", question, expected))


def read_contexts(ds: Dataset, refs: list[tuple[str, int, str | None]]) -> dict[tuple[str, int], list[str]]:
    """The retrieval context of a few rows, by (file URI, 0-based row in the file), for reports.

    A row is returned only when its content still hashes to the ``content_hash`` the run recorded: the
    dataset file may have been rewritten since (a re-index), and showing today's chunks beside last week's
    verdicts would mislead. Contexts supplied at run time (retriever, retrieval results) never match.
    """
    by_file: dict[str, list[tuple[int, str | None]]] = {}
    for uri, row, digest in refs:
        by_file.setdefault(uri, []).append((row, digest))
    files = {f.uri: f for f in ds.files}
    out: dict[tuple[str, int], list[str]] = {}
    read_cols = list(dict.fromkeys(ds.columns.values()))
    roles_only = replace(ds, passthrough=[])
    for uri, wanted in by_file.items():
        f = files.get(uri)
        if f is None:
            continue
        with _parquet(ds, f) as pf:
            starts = _group_starts(pf)
            by_group: dict[int, list[tuple[int, str | None]]] = {}
            for row, digest in wanted:
                if 0 <= row < starts[-1]:
                    by_group.setdefault(bisect.bisect_right(starts, row) - 1, []).append((row, digest))
            for group, members in by_group.items():  # each needed row group read once
                table = pf.read_row_group(group, columns=read_cols)
                for row, digest in members:
                    block = _block(roles_only, uri, row, table.slice(row - starts[group], 1), ds.columns, {})
                    if block.content_hashes[0] == digest:
                        out[(uri, row)] = [c or "" for c in block.table.column("retrieval_context")[0].as_py() or []]
    return out


def read_questions(ds: Dataset, refs: list[tuple[str, int, str]]) -> dict[str, str]:
    """The question of a few rows by row id, from (file URI, 0-based row in the file, row id), for reports.

    A row is returned only when it still has that id (its ``row_id`` value, or the hash of its question and
    reference answer): the file may have been rewritten since the run. Unlike :func:`read_contexts` the contexts
    may differ (a run with ``--retrieval-uri``): a question does not depend on them.
    """
    by_file: dict[str, list[tuple[int, str]]] = {}
    for uri, row, row_id in refs:
        by_file.setdefault(uri, []).append((row, row_id))
    files = {f.uri: f for f in ds.files}
    cols = [c for c in (ds.columns.get("row_id"), ds.columns.get("input"), ds.columns.get("expected_output")) if c]
    out: dict[str, str] = {}
    for uri, wanted in by_file.items():
        f = files.get(uri)
        if f is None or "input" not in ds.columns:
            continue
        with _parquet(ds, f) as pf:
            starts = _group_starts(pf)
            by_group: dict[int, list[tuple[int, str]]] = {}
            for row, row_id in wanted:
                if 0 <= row < starts[-1]:
                    by_group.setdefault(bisect.bisect_right(starts, row) - 1, []).append((row, row_id))
            for group, members in by_group.items():
                table = pf.read_row_group(group, columns=list(dict.fromkeys(cols)))
                for row, row_id in members:
                    one = table.slice(row - starts[group], 1)
                    question = one.column(ds.columns["input"]).cast(pa.string())[0].as_py()
                    if ds.has_row_id:
                        same = str(one.column(ds.columns["row_id"])[0].as_py()) == row_id
                    else:
                        expected = None
                        if "expected_output" in ds.columns:
                            expected = one.column(ds.columns["expected_output"]).cast(pa.string())[0].as_py()
                        same = identity_hash(question, expected) == row_id.split("~", 1)[0]
                    if same and question:
                        out[row_id] = question
    return out


def iter_blocks(ds: Dataset, block_rows: int) -> Iterator[RowBlock]:
    """Stream the dataset as blocks of at most ``block_rows`` rows, one row group in memory at a time."""
    if block_rows < 1:
        raise DatasetError(f"chunk size must be at least 1, got {block_rows}")
    role_cols = dict(ds.columns)
    read_cols = _read_columns(ds)
    seen: dict[str, int] = {}
    for f in ds.files:
        with _parquet(ds, f) as pf:
            offset = 0
            for g in range(pf.num_row_groups):
                try:
                    group = pf.read_row_group(g, columns=read_cols)
                except (pa.ArrowInvalid, OSError) as exc:
                    if isinstance(exc, FileNotFoundError | PermissionError):
                        raise translate_storage_error(exc, f.uri, fs=ds.fs) from None
                    rows = pf.metadata.row_group(g).num_rows
                    raise DatasetError(
                        f"row group {g} (rows {offset}-{offset + rows - 1}) cannot be read: {one_line(exc)}",
                        uri=f.uri,
                    ) from None
                for start in range(0, group.num_rows, block_rows):
                    part = group.slice(start, block_rows)
                    yield _block(ds, f.uri, offset + start, part, role_cols, seen)
                offset += group.num_rows


def _block(
    ds: Dataset, uri: str, first_row: int, part: pa.Table, role_cols: dict[str, str], seen: dict[str, int]
) -> RowBlock:
    arrays: dict[str, pa.Array | pa.ChunkedArray] = {}
    for role in ("input", "expected_output", "retrieval_context", "actual_output"):
        col = role_cols.get(role)
        typ = pa.list_(pa.string()) if role == "retrieval_context" else pa.string()
        if col is None:
            arrays[role] = pa.nulls(part.num_rows, typ)
        else:
            arrays[role] = part.column(col).cast(typ)
    if "messages" in role_cols:  # as stored: list<struct> or JSON text (read by io/traces.py)
        arrays["messages"] = part.column(role_cols["messages"])
    content = list(
        zip(
            *(arrays[r].to_pylist() for r in ("input", "expected_output", "retrieval_context", "actual_output")),
            strict=True,
        )
    )
    hashes = [content_hash(row) for row in content]
    if ds.has_row_id:
        row_ids = [str(v) for v in part.column(role_cols["row_id"]).to_pylist()]
    else:
        row_ids = []
        for question, expected, _, _ in content:
            h = identity_hash(question, expected)
            n = seen.get(h, 0) + 1
            seen[h] = n
            row_ids.append(h if n == 1 else f"{h}~{n}")
    for name in ds.passthrough:
        if name not in arrays:
            column = part.column(name)
            target = ds.passthrough_types.get(name, column.type)
            # safe=False: timestamps are truncated to microseconds; every other cast is lossless (stored_type)
            arrays[name] = column if column.type == target else column.cast(target, safe=False)
    return RowBlock(source=uri, first_row=first_row, row_ids=row_ids, content_hashes=hashes, table=pa.table(arrays))


def read_block(ds: Dataset, source: str, first_row: int, rows: int, seen: Mapping[str, int] | None = None) -> RowBlock:
    """Re-read the one block :func:`iter_blocks` yielded at ``(source, first_row)`` with ``rows`` rows.

    ``seen``: for each identity hash of the block that occurred earlier in the dataset, how many times (what
    :func:`iter_blocks`' running count held before the block), so duplicate rows get the same ``~N`` ids.
    A block never spans row groups, so one row group is read. Used by worker processes (``pipeline/workers.py``).
    """
    f = next((f for f in ds.files if f.uri == source), None)
    if f is None:
        raise DatasetError(f"no file {source} in the dataset any more: it changed during the run", uri=ds.uri)
    read_cols = _read_columns(ds)
    with _parquet(ds, f) as pf:
        starts = _group_starts(pf)
        if not 0 <= first_row < starts[-1]:
            raise DatasetError(f"row {first_row} is past the file's {starts[-1]} rows: it changed", uri=f.uri)
        g = bisect.bisect_right(starts, first_row) - 1
        try:
            group = pf.read_row_group(g, columns=read_cols)
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, FileNotFoundError | PermissionError):
                raise translate_storage_error(exc, f.uri, fs=ds.fs) from None
            raise DatasetError(f"row group {g} cannot be read: {one_line(exc)}", uri=f.uri) from None
    part = group.slice(first_row - starts[g], rows)
    return _block(ds, f.uri, first_row, part, dict(ds.columns), dict(seen or {}))


def iter_row_ids(ds: Dataset) -> Iterator[str]:
    """Every row's id in dataset order, as :func:`iter_blocks` gives them, reading only the columns ids come from.

    The ``row_id`` column when there is one; else the question and reference answer (hashed as in
    :func:`_block`, with the same ``~N`` suffixes). Used by the pre-flight check of ``--retrieval-uri``.
    """
    if ds.has_row_id:
        cols = [ds.columns["row_id"]]
    else:
        cols = [ds.columns[r] for r in ("input", "expected_output") if r in ds.columns]
    seen: dict[str, int] = {}
    for f in ds.files:
        with _parquet(ds, f) as pf:
            for g in range(pf.num_row_groups):
                try:
                    group = pf.read_row_group(g, columns=cols)
                except (pa.ArrowInvalid, OSError) as exc:
                    if isinstance(exc, FileNotFoundError | PermissionError):
                        raise translate_storage_error(exc, f.uri, fs=ds.fs) from None
                    raise DatasetError(f"row group {g} cannot be read: {one_line(exc)}", uri=f.uri) from None
                if ds.has_row_id:
                    yield from (str(v) for v in group.column(0).to_pylist())
                    continue
                values = {r: group.column(ds.columns[r]).cast(pa.string()).to_pylist()
                          for r in ("input", "expected_output") if r in ds.columns}  # fmt: skip
                nulls = [None] * group.num_rows
                for question, expected in zip(
                    values.get("input", nulls), values.get("expected_output", nulls), strict=True
                ):
                    h = identity_hash(question, expected)
                    n = seen.get(h, 0) + 1
                    seen[h] = n
                    yield h if n == 1 else f"{h}~{n}"


def _read_columns(ds: Dataset) -> list[str]:
    """The columns a block reads: the roles' and the pass-through ones, each once."""
    return list(dict.fromkeys([*ds.columns.values(), *ds.passthrough]))


@contextlib.contextmanager
def _parquet(ds: Dataset, f: DatasetFile) -> Iterator[pq.ParquetFile]:
    """One dataset file open for reading; a storage error is named by the storage layer with the file's URI."""
    try:
        fh = ds.fs.open(f.path, "rb")
    except Exception as exc:  # noqa: BLE001 - any fsspec backend's error, translated
        raise translate_storage_error(exc, f.uri) from None
    with fh:
        yield open_parquet(ds.fs, f.path, f.uri, fh, ds.json_columns)


def _group_starts(pf: pq.ParquetFile) -> list[int]:
    """The first row of each row group, and the file's row count last."""
    starts = [0]
    for g in range(pf.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
    return starts
