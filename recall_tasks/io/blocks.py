"""A dataset's rows, as blocks: streamed a block at a time, with stable row ids and content hashes.

- :func:`iter_blocks` cuts each row group into blocks of at most ``--chunk-size`` rows from the group's start,
  decoding one block at a time (``ParquetFile.iter_batches`` with only the needed columns): neither the dataset
  nor a whole row group is ever in memory (a writer may put a million rows in one group).
  :func:`read_block` re-reads one of those blocks (worker processes); :mod:`~recall_tasks.io.lookup` reads a few
  rows' contexts and questions (reports).
- Row ids: the ``row_id`` column, else :func:`identity_hash` of the question and the reference answer with
  ``~2``, ``~3``... suffixes for exact duplicates in dataset order (``io/datasets.py``, "Row identity").
  :func:`content_hash` (every judged field) is the key of the verdict caches.
- Role columns are cast to ``string``/``list<string>`` under their role names; pass-through columns to their
  stored type (``io/columns.stored_type``).
- A data page that cannot be decoded, or text that is not UTF-8, is found here, when its rows are read: one
  DatasetError naming the file and the rows.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError
from recall_tasks.io.columns import JUDGED_ROLES
from recall_tasks.io.datasets import Dataset, DatasetFile
from recall_tasks.io.dedup import Occurrences, first_rows
from recall_tasks.io.group_reads import group_parts, group_rows
from recall_tasks.io.storage import read_error, translate_storage_error
from recall_tasks.io.textfiles import open_parquet


@dataclass
class RowBlock:
    """A slice of rows, already mapped to roles, with stable row ids and content hashes."""

    source: str
    first_row: int  # 0-based index of the block's first row within its file
    row_ids: list[str]
    content_hashes: list[str]
    table: pa.Table  # role columns under role names + pass-through columns
    #: each row's (file URI, 0-based row in the file) when the rows are not one run of a file (a grouped chunk)
    positions: list[tuple[str, int]] | None = None
    same_as: list[int] | None = None  # a grouped chunk: each row's index of its group's first row (read_rows)

    def where(self, i: int) -> tuple[str, int]:
        """Row ``i``'s file URI and 0-based row within that file."""
        return self.positions[i] if self.positions is not None else (self.source, self.first_row + i)


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


def iter_blocks(ds: Dataset, block_rows: int) -> Iterator[RowBlock]:
    """Stream the dataset as blocks of at most ``block_rows`` rows, one row group in memory at a time."""
    if block_rows < 1:
        raise DatasetError(f"chunk size must be at least 1, got {block_rows}")
    role_cols = dict(ds.columns)
    read_cols = _read_columns(ds)
    seen = Occurrences()
    for f in ds.files:
        with open_file(ds, f) as pf:
            offset = 0
            for g in range(pf.num_row_groups):
                for start, part in group_parts(ds, f.uri, pf, g, offset, read_cols, block_rows):
                    yield role_block(ds, f.uri, offset + start, part, role_cols, seen)
                offset += pf.metadata.row_group(g).num_rows


def role_block(
    ds: Dataset, uri: str, first_row: int, part: pa.Table, role_cols: dict[str, str], seen: Occurrences | None = None
) -> RowBlock:
    arrays: dict[str, pa.Array | pa.ChunkedArray] = {}
    for role in JUDGED_ROLES:
        col = role_cols.get(role)
        typ = pa.list_(pa.string()) if role == "retrieval_context" else pa.string()
        if col is None:
            arrays[role] = pa.nulls(part.num_rows, typ)
        else:
            arrays[role] = part.column(col).cast(typ)
    for role in sorted(role_cols.keys() - {*arrays, "row_id"}):  # as stored: messages (io/traces.py), ids (ids_step)
        arrays[role] = part.column(role_cols[role])
    content = list(zip(*(_texts(arrays[r], role_cols.get(r, r), uri, first_row) for r in JUDGED_ROLES), strict=True))
    hashes = [content_hash(row) for row in content]
    if ds.has_row_id:
        row_ids = [str(v) for v in part.column(role_cols["row_id"]).to_pylist()]
    else:
        identities = [identity_hash(question, expected) for question, expected, _, _ in content]
        numbers = (seen if seen is not None else Occurrences()).count(identities)
        row_ids = [h if n == 1 else f"{h}~{n}" for h, n in zip(identities, numbers, strict=True)]
    for name in ds.passthrough:
        if name not in arrays:
            column = part.column(name)
            target = ds.passthrough_types.get(name, column.type)
            # safe=False: timestamps are truncated to microseconds; every other cast is lossless (stored_type)
            arrays[name] = column if column.type == target else column.cast(target, safe=False)
    return RowBlock(source=uri, first_row=first_row, row_ids=row_ids, content_hashes=hashes, table=pa.table(arrays))


def _texts(array: pa.Array | pa.ChunkedArray, column: str, uri: str, first_row: int) -> list[Any]:
    """The column's values; text that is not UTF-8 (Arrow does not check it on read) is one DatasetError."""
    try:
        values: list[Any] = array.to_pylist()
    except UnicodeDecodeError:
        bad = next(i for i in range(len(array)) if not _decodes(array[i]))
        raise DatasetError(f"column {column!r} holds text that is not valid UTF-8 in row {first_row + bad}",
                           uri=uri) from None  # fmt: skip
    return values


def _decodes(value: pa.Scalar) -> bool:
    try:
        value.as_py()
    except UnicodeDecodeError:
        return False
    return True


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
    with open_file(ds, f) as pf:
        starts = group_starts(pf)
        if not 0 <= first_row < starts[-1]:
            raise DatasetError(f"row {first_row} is past the file's {starts[-1]} rows: it changed", uri=f.uri)
        g = bisect.bisect_right(starts, first_row) - 1
        part = group_rows(ds, f.uri, pf, g, read_cols, first_row - starts[g], rows)
    return role_block(ds, f.uri, first_row, part, dict(ds.columns), Occurrences(dict(seen or {})))


@dataclass
class Layout:
    """How a run cuts its dataset into chunks: contiguous blocks, or, when rows repeat, chunks that keep identical
    rows together (:func:`plan_layout`)."""

    #: each chunk's rows as indices in dataset order (all files in order); None: contiguous blocks (no repeats)
    chunks: list[list[int]] | None = None
    #: per chunk, each row's chunk-local index of the first row of its group (whose role values it has)
    same_as: list[list[int]] | None = None
    row_ids: list[str] | None = None  # every row's id in dataset order (grouped chunks of a dataset without row_id)
    repeats: int = 0  # rows identical to an earlier row (same content hash)


def plan_layout(ds: Dataset, block_rows: int) -> Layout:
    """The chunks of a run: every row with the same content (:func:`content_hash` of its role columns) in one chunk.

    Rows with the same content send the same judge request; in one chunk they share it whatever process scores the
    chunk (``pipeline/scoring.SharedRequests``). One pass over the role columns (not the pass-through ones) first;
    a dataset without repeats keeps the contiguous blocks of :func:`iter_blocks` (the same chunks as before). With
    repeats, each row not seen before starts a group with all its later copies; groups fill chunks of at most
    ``block_rows`` rows in dataset order, a group never split (a chunk holding one group larger than that is
    larger). The plan keeps a few dozen bytes per row; making it, 12 and a sort (``io/dedup.first_rows``).
    """
    if block_rows < 1:
        raise DatasetError(f"chunk size must be at least 1, got {block_rows}")
    roles_only = replace(ds, passthrough=[])
    digests = bytearray()  # every row's content hash, 12 bytes each (io/dedup.py)
    row_ids: list[str] = []
    for block in iter_blocks(roles_only, max(block_rows, 8192)):
        digests += bytes.fromhex("".join(block.content_hashes))
        if not ds.has_row_id:
            row_ids += block.row_ids
    lead = first_rows(digests)
    if lead is None:
        return Layout()
    n = len(lead)
    later: dict[int, list[int]] = {}
    copied = bytearray(n)
    for i in np.flatnonzero(lead != np.arange(n)).tolist():
        later.setdefault(int(lead[i]), []).append(i)
        copied[i] = 1
    chunks: list[list[int]] = []
    same_as: list[list[int]] = []
    chunk: list[int] = []
    same: list[int] = []
    for i in range(n):
        if copied[i]:
            continue
        group = [i, *later.get(i, ())]
        if chunk and len(chunk) + len(group) > block_rows:
            chunks.append(chunk)
            same_as.append(same)
            chunk, same = [], []
        same += [len(chunk)] * len(group)
        chunk += group
    if chunk:
        chunks.append(chunk)
        same_as.append(same)
    return Layout(chunks, same_as, None if ds.has_row_id else row_ids, sum(map(len, later.values())))


def iter_layout(ds: Dataset, layout: Layout, block_rows: int) -> Iterator[RowBlock]:
    """The blocks of ``layout`` in order: :func:`iter_blocks`, or the grouped chunks (each row where it is)."""
    if layout.chunks is None:
        yield from iter_blocks(ds, block_rows)
        return
    assert layout.same_as is not None
    reader = _RowReader(ds)
    for chunk, same in zip(layout.chunks, layout.same_as, strict=True):
        positions = [reader.position(i) for i in chunk]
        ids = [layout.row_ids[i] for i in chunk] if layout.row_ids is not None else None
        yield reader.block(positions, same, ids)


def read_rows(ds: Dataset, positions: list[tuple[str, int]], same_as: list[int], row_ids: list[str] | None) -> RowBlock:
    """Re-read a grouped chunk of :func:`iter_layout` from its rows' positions, groups and ids (worker processes)."""
    return _RowReader(ds).block(positions, same_as, row_ids)


class _RowReader:
    """Rows at any (file, row) of a dataset, the last few row groups read kept decoded (a grouped chunk's rows are
    mostly in the row group at hand and in a few later ones)."""

    KEEP_GROUPS = 8

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds
        self.files = {f.uri: f for f in ds.files}
        self.file_starts = [0]
        for f in ds.files:
            self.file_starts.append(self.file_starts[-1] + f.num_rows)
        self.group_starts: dict[str, list[int]] = {}
        self.groups: dict[tuple[str, int, int], pa.Table] = {}  # (file, row group, columns): oldest first

    def position(self, index: int) -> tuple[str, int]:
        """The (file URI, row in the file) of row ``index`` in dataset order."""
        k = bisect.bisect_right(self.file_starts, index) - 1
        return self.ds.files[k].uri, index - self.file_starts[k]

    def _locate(self, uri: str, row: int) -> tuple[int, int]:
        """The row group holding ``row`` of file ``uri`` and the row's offset in it."""
        f = self.files.get(uri)
        if f is None:
            raise DatasetError(f"no file {uri} in the dataset any more: it changed during the run", uri=self.ds.uri)
        starts = self.group_starts.get(uri)
        if starts is None:
            with open_file(self.ds, f) as pf:
                starts = self.group_starts[uri] = group_starts(pf)
        if not 0 <= row < starts[-1]:
            raise DatasetError(f"row {row} is past the file's {starts[-1]} rows: it changed", uri=uri)
        g = bisect.bisect_right(starts, row) - 1
        return g, row - starts[g]

    def _group(self, uri: str, g: int, columns: list[str]) -> pa.Table:
        key = (uri, g, len(columns))
        table = self.groups.pop(key, None)
        if table is None:
            with open_file(self.ds, self.files[uri]) as pf:
                try:
                    table = pf.read_row_group(g, columns=columns)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise read_error(exc, uri, f"row group {g} cannot be read", fs=self.ds.fs) from None
            while len(self.groups) >= self.KEEP_GROUPS:
                del self.groups[next(iter(self.groups))]
        self.groups[key] = table
        return table

    def _rows(self, positions: list[tuple[str, int]], columns: list[str]) -> pa.Table:
        """The rows at ``positions`` in that order, with ``columns``: each row group read once."""
        parts: dict[tuple[str, int], list[tuple[int, int]]] = {}  # row group -> (offset in it, place)
        for place, (uri, row) in enumerate(positions):
            g, offset = self._locate(uri, row)
            parts.setdefault((uri, g), []).append((offset, place))
        pieces, order = [], []
        for (uri, g), members in parts.items():
            offsets = pa.array([offset for offset, _ in members], pa.int64())
            pieces.append(self._group(uri, g, columns).take(offsets))
            order += [place for _, place in members]
        at = [0] * len(order)
        for taken, place in enumerate(order):
            at[place] = taken
        return pa.concat_tables(pieces).take(pa.array(at, pa.int64()))

    def block(self, positions: list[tuple[str, int]], same_as: list[int], row_ids: list[str] | None) -> RowBlock:
        """The chunk's rows. A copy's judged columns are its group's first row's (same content hash): only its own
        other columns (row id, pass-through, messages) are read, so copies spread over the files cost narrow reads."""
        full = _read_columns(self.ds)
        judged = {self.ds.columns[r] for r in JUDGED_ROLES
                  if r in self.ds.columns}  # fmt: skip
        own = [c for c in full if c not in judged]
        leads = sorted(set(same_as))
        lead_rows = self._rows([positions[i] for i in leads], full)
        where = {i: k for k, i in enumerate(leads)}
        copies = [i for i in range(len(positions)) if same_as[i] != i]
        part = lead_rows.take(pa.array([where[same_as[i]] for i in range(len(positions))], pa.int64()))
        if copies and own:
            copy_rows = self._rows([positions[i] for i in copies], own)
            at = {i: len(leads) + k for k, i in enumerate(copies)}
            pick = pa.array([at[i] if i in at else where[i] for i in range(len(positions))], pa.int64())
            for name in own:
                merged = pa.chunked_array([*lead_rows.column(name).chunks, *copy_rows.column(name).chunks])
                part = part.set_column(part.column_names.index(name), name, merged.take(pick))
        block = role_block(self.ds, positions[0][0], positions[0][1], part, dict(self.ds.columns))
        block.positions, block.same_as = list(positions), list(same_as)
        if row_ids is not None:
            block.row_ids = list(row_ids)
        return block


def iter_row_ids(ds: Dataset) -> Iterator[str]:
    """Every row's id in dataset order, as :func:`iter_blocks` gives them, reading only the columns ids come from.

    The ``row_id`` column when there is one; else the question and reference answer (hashed as in
    :func:`_block`, with the same ``~N`` suffixes). Used by the pre-flight check of ``--retrieval-uri``.
    """
    if ds.has_row_id:
        cols = [ds.columns["row_id"]]
    else:
        cols = [ds.columns[r] for r in ("input", "expected_output") if r in ds.columns]
    seen = Occurrences()
    for f in ds.files:
        with open_file(ds, f) as pf:
            for g in range(pf.num_row_groups):
                try:
                    group = pf.read_row_group(g, columns=cols)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise read_error(exc, f.uri, f"row group {g} cannot be read", fs=ds.fs) from None
                if ds.has_row_id:
                    yield from (str(v) for v in group.column(0).to_pylist())
                    continue
                values = {r: group.column(ds.columns[r]).cast(pa.string()).to_pylist()
                          for r in ("input", "expected_output") if r in ds.columns}  # fmt: skip
                nulls = [None] * group.num_rows
                identities = [identity_hash(question, expected) for question, expected in zip(
                    values.get("input", nulls), values.get("expected_output", nulls), strict=True
                )]  # fmt: skip
                for h, n in zip(identities, seen.count(identities), strict=True):
                    yield h if n == 1 else f"{h}~{n}"


def _read_columns(ds: Dataset) -> list[str]:
    """The columns a block reads: the roles' and the pass-through ones, each once."""
    return list(dict.fromkeys([*ds.columns.values(), *ds.passthrough]))


@contextlib.contextmanager
def open_file(ds: Dataset, f: DatasetFile) -> Iterator[pq.ParquetFile]:
    """One dataset file open for reading; a storage error is named by the storage layer with the file's URI."""
    try:
        fh = ds.fs.open(f.path, "rb")
    except Exception as exc:  # noqa: BLE001 - any fsspec backend's error, translated
        raise translate_storage_error(exc, f.uri) from None
    with fh:
        yield open_parquet(ds.fs, f.path, f.uri, fh, ds.json_columns, ds.text_columns)


def group_starts(pf: pq.ParquetFile) -> list[int]:
    """The first row of each row group, and the file's row count last."""
    starts = [0]
    for g in range(pf.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
    return starts
