"""Relevance judgements (qrels) as their own file: read, checked, and joined to a dataset's rows by row id.

Two formats, read through fsspec (a path, ``file://``, ``s3://``...):

- Parquet (``PAR1`` magic or a ``.parquet``/``.pq`` name): columns ``query_id``, ``doc_id`` (strings or
  integers) and ``relevance`` (non-negative integers; whole floats such as ``2.0`` are read as integers). Without
  a ``relevance`` column every pair is relevant (1).
- anything else is a TREC qrels text file: ``query_id iteration doc_id relevance`` per line, whitespace-separated
  (the iteration, usually ``0``, is ignored); blank lines and lines starting with ``#`` are skipped.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError
from recall_tasks.io.storage import StorageConfig, filesystem, translate_storage_error

_IDS = pa.list_(pa.string())
_GRADES = pa.list_(pa.int64())
_INTEGER = re.compile(r"[+-]?[0-9]+")
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
        with fs.open(path, "rb") as fh:
            raw = fh.read()
    except Exception as exc:  # noqa: BLE001 - every storage failure becomes one clear message
        raise translate_storage_error(exc, uri, config=storage, fs=fs) from None
    if raw[:4] == b"PAR1" or path.lower().endswith((".parquet", ".pq")):
        queries, docs, grades, where = _parquet(raw, uri)
    else:
        queries, docs, grades, where = _text(raw, uri)
    return _group(uri, queries, docs, grades, where)


def _text(raw: bytes, uri: str) -> tuple[list[str], list[str], list[int], list[str]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"qrels are not UTF-8 text nor Parquet (byte {exc.start}); expected {FORMAT}", uri=uri
        ) from None
    queries: list[str] = []
    docs: list[str] = []
    grades: list[int] = []
    where: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 4:
            raise DatasetError(
                f"malformed qrels line {number}: {len(fields)} fields in {line.strip()[:80]!r}; expected {FORMAT}",
                uri=uri,
            )
        grade = fields[3]
        if not _INTEGER.fullmatch(grade):
            raise DatasetError(f"qrels line {number}: relevance {grade[:20]!r} is not an integer", uri=uri)
        if int(grade) < 0:
            raise DatasetError(f"qrels line {number}: relevance {grade} is negative (0 = judged not relevant)", uri=uri)
        queries.append(fields[0])
        docs.append(fields[2])
        grades.append(int(grade))
        where.append(f"line {number}")
    return queries, docs, grades, where


def _parquet(raw: bytes, uri: str) -> tuple[list[str], list[str], list[int], list[str]]:
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
        grades = [1] * table.num_rows
    return ids[0], ids[1], grades, [f"row {i}" for i in range(table.num_rows)]


def _first(mask: Any) -> int:
    return int(np.flatnonzero(np.asarray(mask.fill_null(True)))[0])


def _id_strings(column: pa.Array, uri: str, name: str) -> list[str]:
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
    values: list[str] = strings.to_pylist()
    return values


def _grades(column: pa.Array, uri: str) -> list[int]:
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
    values: list[int] = grades.to_pylist()
    return values


def _group(uri: str, queries: list[str], docs: list[str], grades: list[int], where: list[str]) -> Qrels:
    """Per query, its docs and grades in file order; conflicting duplicates refused, identical ones kept once."""
    if not queries:
        raise DatasetError(f"the qrels file has no judgements; expected {FORMAT}", uri=uri)
    judged: dict[str, dict[str, int]] = {}
    first_seen: dict[tuple[str, str], int] = {}
    for i, (query, doc, grade) in enumerate(zip(queries, docs, grades, strict=True)):
        per_query = judged.setdefault(query, {})
        earlier = per_query.get(doc)
        if earlier is None:
            per_query[doc] = grade
            first_seen[(query, doc)] = i
        elif earlier != grade:
            j = first_seen[(query, doc)]
            raise DatasetError(
                f"qrels judge query {query!r} doc {doc!r} twice with different relevance: {earlier} on {where[j]}, "
                f"{grade} on {where[i]}", uri=uri,
            )  # fmt: skip
    lengths = np.fromiter((len(d) for d in judged.values()), np.int64, count=len(judged))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    doc_values = pa.array([d for per_query in judged.values() for d in per_query], pa.string())
    grade_values = pa.array([g for per_query in judged.values() for g in per_query.values()], pa.int64())
    return Qrels(
        uri=uri,
        query_ids=pa.array(list(judged), pa.string()),
        doc_ids=pa.ListArray.from_arrays(offsets, doc_values, type=_IDS),
        relevance=pa.ListArray.from_arrays(offsets, grade_values, type=_GRADES),
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
