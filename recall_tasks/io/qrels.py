"""Relevance judgements (qrels) as their own file: read, checked, and joined to a dataset's rows by row id.

Two formats, read through fsspec (a path, ``file://``, ``s3://``...):

- Parquet (``PAR1`` magic or a ``.parquet``/``.pq`` name): columns ``query_id``, ``doc_id`` (strings or
  integers) and ``relevance`` (non-negative integers; whole floats such as ``2.0`` are read as integers). Without
  a ``relevance`` column every pair is relevant (1).
- anything else is a TREC qrels text file: ``query_id iteration doc_id relevance`` per line, whitespace-separated
  (the iteration, usually ``0``, is ignored); blank lines and lines starting with ``#`` are skipped.

A name ending ``.gz``, ``.bz2``, ``.xz``, ``.zst``... is decompressed first.

Ids compare as strings (``7`` and ``"7"`` are one id). A (query, doc) pair judged twice with the same relevance
counts once; with different relevance the file is refused. Each error is one :class:`DatasetError` naming the
file and the line (text, 1-based) or row (Parquet, 0-based): a malformed line, a relevance that is negative or not
an integer, a null or float id, conflicting duplicates, a file with no judgements.

A query id is the dataset's row id (its ``row_id`` column: rows without one get content-hash ids that no qrels
file can name). :func:`refuse_unmatched` refuses, before any work, qrels naming ids that match no row (a typo, the
wrong dataset); rows without judgements are not assessed (:func:`qrels_for` gives them null).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.utils import infer_compression

from recall_tasks.errors import DatasetError
from recall_tasks.io.storage import StorageConfig, filesystem, translate_storage_error

_IDS = pa.list_(pa.string())
_GRADES = pa.list_(pa.int64())
_INTEGER = re.compile(r"[+-]?[0-9]+")
Ints = npt.NDArray[np.int64]
FORMAT = "query_id 0 doc_id relevance (TREC qrels, whitespace-separated) or Parquet with query_id, doc_id, relevance"


@dataclass(frozen=True)
class Qrels:
    """One entry per judged query: its id, its judged doc ids and their relevance (aligned lists)."""

    uri: str
    query_ids: pa.Array  # string, unique
    doc_ids: pa.ListArray  # list<string>
    relevance: pa.ListArray  # list<int64>, >= 0

    def __len__(self) -> int:
        return len(self.query_ids)


def read_qrels(uri: str, storage: StorageConfig | None = None) -> Qrels:
    """Read and check the qrels at ``uri`` (see the module docstring); raise one DatasetError or StorageError."""
    fs, path = filesystem(uri, storage)
    try:
        with fs.open(path, "rb", compression=infer_compression(path)) as fh:
            raw = fh.read()
    except Exception as exc:  # noqa: BLE001 - every storage failure becomes one clear message
        raise translate_storage_error(exc, uri, config=storage, fs=fs) from None
    if raw[:4] == b"PAR1" or path.lower().endswith((".parquet", ".pq")):
        return _group(uri, *_parquet(raw, uri))
    return _group(uri, *_text(raw, uri))


def _cut(field: str, limit: int) -> str:
    """One field of the file quoted, cut to its first ``limit`` characters."""
    return repr(field) if len(field) <= limit else f"{field[:limit]!r}..."


def _text(raw: bytes, uri: str) -> tuple[pa.Array, pa.Array, Ints, Callable[[int], str]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"qrels are not UTF-8 text nor Parquet (byte {exc.start}); expected {FORMAT}", uri=uri
        ) from None
    queries: list[str] = []
    docs: list[str] = []
    grades: list[int] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 4:  # the line itself is never quoted: a file given by mistake may hold secrets
            raise DatasetError(
                f"malformed qrels line {number}: {len(fields)} field{'s' if len(fields) != 1 else ''}, expected 4 "
                "(query_id 0 doc_id relevance, whitespace-separated; or a Parquet file with query_id, doc_id, "
                "relevance)", uri=uri,
            )  # fmt: skip
        grade = fields[3]
        if not _INTEGER.fullmatch(grade):
            raise DatasetError(f"qrels line {number}: relevance {_cut(grade, 8)} is not an integer", uri=uri)
        if int(grade) < 0:
            raise DatasetError(f"qrels line {number}: relevance {grade} is negative (0 = judged not relevant)", uri=uri)
        queries.append(fields[0])
        docs.append(fields[2])
        grades.append(int(grade))
        lines.append(number)
    return (
        pa.array(queries, pa.string()),
        pa.array(docs, pa.string()),
        np.array(grades, np.int64),
        (lambda i: f"line {lines[i]}"),
    )


def _parquet(raw: bytes, uri: str) -> tuple[pa.Array, pa.Array, Ints, Callable[[int], str]]:
    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"qrels are not readable Parquet: {' '.join(str(exc).split())[:200]}", uri=uri) from None
    missing = [c for c in ("query_id", "doc_id") if c not in table.column_names]
    if missing:
        raise DatasetError(
            f"qrels Parquet lacks {', '.join(missing)}; expected columns query_id, doc_id, relevance "
            f"(found {', '.join(table.column_names)})", uri=uri,
        )  # fmt: skip
    ids = [_id_strings(table.column(c).combine_chunks(), uri, c) for c in ("query_id", "doc_id")]
    if "relevance" in table.column_names:
        grades = _grades(table.column("relevance").combine_chunks(), uri)
    else:
        grades = np.ones(table.num_rows, np.int64)
    return ids[0], ids[1], grades, lambda i: f"row {i}"


def _first(mask: Any) -> int:
    return int(np.flatnonzero(np.asarray(mask.fill_null(True)))[0])


def _id_strings(column: pa.Array, uri: str, name: str) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    typ = column.type
    if not (pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        what = (
            "floats are not ids (write them as integers or strings)"
            if pa.types.is_floating(typ)
            else "ids are strings or integers"
        )
        raise DatasetError(f"{what}; found {typ}", uri=uri, column=name, row=0)
    if column.null_count:
        raise DatasetError("an id is null", uri=uri, column=name, row=_first(column.is_null()))
    strings = column.cast(pa.string())
    empty = pc.equal(pc.binary_length(strings), 0)
    if len(strings) and pc.any(empty).as_py():
        raise DatasetError("an id is an empty string", uri=uri, column=name, row=_first(empty))
    return strings


def _grades(column: pa.Array, uri: str) -> Ints:
    typ = column.type
    if column.null_count:
        raise DatasetError("a relevance is null", uri=uri, column="relevance", row=_first(column.is_null()))
    if pa.types.is_floating(typ):
        whole = pc.and_(pc.is_finite(column), pc.equal(pc.floor(column), column))
        if len(column) and not pc.all(whole).as_py():
            raise DatasetError(
                "a relevance is not an integer", uri=uri, column="relevance", row=_first(pc.invert(whole))
            )
    elif not pa.types.is_integer(typ):
        raise DatasetError(f"relevance is a non-negative integer; found {typ}", uri=uri, column="relevance", row=0)
    grades = column.cast(pa.int64())
    negative = pc.less(grades, 0)
    if len(grades) and pc.any(negative).as_py():
        raise DatasetError(
            "a relevance is negative (0 = judged not relevant)", uri=uri, column="relevance", row=_first(negative)
        )
    return np.asarray(grades, dtype=np.int64)


def _group(uri: str, queries: pa.Array, docs: pa.Array, grades: Ints, where: Callable[[int], str]) -> Qrels:
    """Per query (in order of first appearance), its docs and grades in file order; a pair judged twice with
    different grades refused, with the same grade kept once. Vectorized: codes from hash tables, one stable sort."""
    if not len(queries):
        raise DatasetError(f"the qrels file has no judgements; expected {FORMAT}", uri=uri)
    q, d = pc.dictionary_encode(queries), pc.dictionary_encode(docs)
    q_codes = np.asarray(q.indices, dtype=np.int64)
    key = q_codes * len(d.dictionary) + np.asarray(d.indices, dtype=np.int64)
    order = np.argsort(key, kind="stable")
    start = np.ones(len(order), bool)
    start[1:] = key[order][1:] != key[order][:-1]
    first = order[np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))]  # each pair's first line/row
    conflict = np.flatnonzero(grades[order] != grades[first])
    if len(conflict):
        at = conflict[np.argmin(order[conflict])]
        i, j = int(order[at]), int(first[at])
        raise DatasetError(
            f"qrels judge query {_cut(queries[i].as_py(), 80)} doc {_cut(docs[i].as_py(), 80)} twice with different "
            f"relevance: {grades[j]} on {where(j)}, {grades[i]} on {where(i)}", uri=uri,
        )  # fmt: skip
    kept = np.sort(order[start])
    kept = kept[np.argsort(q_codes[kept], kind="stable")]
    counts = np.bincount(q_codes[kept], minlength=len(q.dictionary))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return Qrels(
        uri=uri,
        query_ids=q.dictionary,
        doc_ids=pa.ListArray.from_arrays(offsets, docs.take(pa.array(kept)), type=_IDS),
        relevance=pa.ListArray.from_arrays(offsets, pa.array(grades[kept]), type=_GRADES),
    )


def _row_id_array(row_ids: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(row_ids, pa.ChunkedArray):
        row_ids = row_ids.combine_chunks()
    if isinstance(row_ids, pa.Array):
        return row_ids.cast(pa.string())
    return pa.array([str(r) for r in row_ids], pa.string())


def unmatched_queries(qrels: Qrels, row_ids: Sequence[str] | pa.Array | pa.ChunkedArray) -> list[str]:
    """The qrels' query ids that match no row id, in file order."""
    matched = pc.is_in(qrels.query_ids, value_set=_row_id_array(row_ids))
    missing: list[str] = qrels.query_ids.filter(pc.invert(matched)).to_pylist()
    return missing


def refuse_unmatched(qrels: Qrels, row_ids: Sequence[str] | pa.Array | pa.ChunkedArray, *, show: int = 5) -> None:
    """A DatasetError when any query id of the qrels matches no row id (call it before any work)."""
    missing = unmatched_queries(qrels, row_ids)
    if not missing:
        return
    listed = ", ".join(repr(q) for q in missing[:show]) + (
        f" and {len(missing) - show} more" if len(missing) > show else ""
    )
    raise DatasetError(
        f"{len(missing)} of the {len(qrels)} qrels query ids match no row id of the dataset: {listed}. Qrels are "
        "joined to rows by row id: the dataset needs a row_id column holding the qrels' query ids", uri=qrels.uri,
    )  # fmt: skip


def qrels_for(qrels: Qrels, row_ids: Sequence[str] | pa.Array | pa.ChunkedArray) -> tuple[pa.ListArray, pa.ListArray]:
    """The judged doc ids and their relevance for each row id, aligned with ``row_ids`` (null: no judgements, the
    row is not assessed)."""
    index = pc.index_in(_row_id_array(row_ids), value_set=qrels.query_ids)
    return qrels.doc_ids.take(index), qrels.relevance.take(index)
