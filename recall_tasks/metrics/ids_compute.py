"""Retrieval metrics from document ids: recall@k, precision@k, hit_rate@k, MRR@k and nDCG@k, as trec_eval defines them.

Pure and vectorized: Arrow list columns in, one Arrow table out, numpy over the flattened values (no Python loop
per row). No I/O, no Prefect.

Definitions (one row = one query; ``retrieved`` in rank order, ``relevant`` the judged ids with their grades):

- ids compare as strings (``7`` and ``"7"`` are one document: :func:`normalise_ids` casts both to string);
- a retrieved id seen earlier in the same list is dropped: it keeps its first rank, counts once, and the ids after
  it move up (trec_eval reads a run as one score per document);
- grade: the id's ``relevance`` (binary 1 when ``relevance`` is None); grade 0, or an id not in ``relevant``, is
  not relevant. An id listed twice in ``relevant`` takes its highest grade;
- ``recall@k`` = relevant ids in the top k / relevant ids; ``precision@k`` = relevant ids in the top k / k (the
  denominator is k even when fewer were retrieved, trec_eval's ``P_k``); ``hit_rate@k`` = 1 when any relevant
  id is in the top k; ``mrr@k`` = 1 / rank of the first relevant id when it is within k, else 0;
  ``ndcg@k`` = DCG@k / ideal DCG@k with gain = grade and discount log2(rank + 1) (trec_eval's ``ndcg_cut``),
  the ideal ranking being the relevant ids' grades, highest first;
- not assessed (null in every column): a row whose relevant list is null or empty, or whose ids all have grade 0
  (recall has no denominator; trec_eval would score such a query 0 and drag the mean down for a query with
  nothing to find). A null retrieved list retrieved nothing: every metric 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.id_params import IdPattern, compile_id_pattern

METRICS = ("recall", "precision", "hit_rate", "mrr", "ndcg")
DEFAULT_KS = (1, 5, 10)
_IDS = pa.list_(pa.string())
_MAX_K = 1_000_000

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,5,10"`` -> ``(1, 5, 10)`` (sorted, repeats dropped); anything but positive integers is a ConfigError."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ConfigError(f"--k {text!r}: give positive integers separated by commas, e.g. --k 1,5,10")
    ks: set[int] = set()
    for part in parts:
        if not re.fullmatch(r"[0-9]+", part) or not 0 < int(part) <= _MAX_K:
            raise ConfigError(
                f"--k {text!r}: {part!r} is not a positive integer (at most {_MAX_K:,}); "
                "give cut-offs separated by commas, e.g. --k 1,5,10"
            )
        ks.add(int(part))
    return tuple(sorted(ks))


def metric_names(ks: Sequence[int]) -> list[str]:
    """The columns :func:`id_metrics` returns for ``ks``, in order: ``recall@1, recall@5, ..., ndcg@10``."""
    return [f"{metric}@{k}" for metric in METRICS for k in ks]


# --- input checks -------------------------------------------------------------------------------------------------


def _lengths(lists: pa.ListArray) -> Ints:
    """Each list's length, 0 for a null list."""
    return np.asarray(pc.list_value_length(lists).fill_null(0), dtype=np.int64)


def _offsets(lists: pa.ListArray) -> Ints:
    """Offsets into ``lists.flatten()`` (which skips a slice's start and what a null list may cover)."""
    return np.concatenate([np.zeros(1, np.int64), np.cumsum(_lengths(lists))])


def _first_row_with(lists: pa.ListArray, element_mask: pa.Array) -> int:
    """The first row of ``lists`` holding an element where ``element_mask`` is true."""
    flat_idx = int(np.flatnonzero(np.asarray(element_mask.fill_null(False)))[0])
    return int(np.searchsorted(_offsets(lists), flat_idx, side="right") - 1)


def normalise_ids(
    arr: pa.ListArray | pa.ChunkedArray,
    *,
    column: str,
    source: str,
    chunk_to_doc: IdPattern | re.Pattern[str] | None = None,
    first_row: int = 0,
) -> pa.ListArray:
    """The ids of ``column`` as ``list<string>``: integers become their decimal text, chunk ids their document id.

    Raises :class:`DatasetError` naming ``source``, the row (``first_row`` + index) and ``column`` for values that
    are not lists, float or other non-id element types, a null inside a list, an empty id, and a chunk id that
    ``chunk_to_doc`` does not match. A null list stays null (no ids: retrieved nothing / not assessed).
    ``chunk_to_doc`` must have exactly one group (a :class:`ConfigError` otherwise); the id becomes what the group
    captured in the first match (``re.search``), matched by RE2 in linear time (a ``re.Pattern`` too, its flags
    kept: RE2 syntax, see :class:`recall_tasks.id_params.IdPattern`).
    """
    if isinstance(chunk_to_doc, re.Pattern):
        chunk_to_doc = _from_re(chunk_to_doc)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    if pa.types.is_null(typ):  # a column with no value at all (JSON lines infer it): no ids in any row
        return pa.nulls(len(arr), _IDS)
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)):
        valid = np.flatnonzero(np.asarray(arr.is_valid()))
        row = int(valid[0]) if len(valid) else 0
        raise DatasetError(
            f"expected a list of ids (list<string> or list<int>), found {typ}", uri=source, column=column,
            row=first_row + row,
        )  # fmt: skip
    if not pa.types.is_list(typ):
        arr = arr.cast(pa.list_(typ.value_type))
    lists: pa.ListArray = arr
    values = lists.flatten()
    vtype = values.type
    if pa.types.is_dictionary(vtype):
        values = values.dictionary_decode()
        vtype = values.type
    if len(values) and values.null_count:
        row = _first_row_with(lists, values.is_null())
        raise DatasetError("an id is null (a list holding nulls)", uri=source, column=column, row=first_row + row)
    if pa.types.is_integer(vtype):
        strings = values.cast(pa.string())
    elif pa.types.is_string(vtype) or pa.types.is_large_string(vtype):
        strings = values.cast(pa.string())
        empty = pc.equal(pc.binary_length(strings), 0)
        if len(values) and pc.any(empty).as_py():
            row = _first_row_with(lists, empty)
            raise DatasetError("an id is an empty string", uri=source, column=column, row=first_row + row)
    elif pa.types.is_null(vtype) and len(values) == 0:
        strings = pa.array([], pa.string())
    else:
        kind = "floats are not ids (write them as integers or strings)" if pa.types.is_floating(vtype) else (
            "ids are strings or integers")  # fmt: skip
        nonempty = np.flatnonzero(np.asarray(pc.list_value_length(lists).fill_null(0)) > 0)
        row = int(nonempty[0]) if len(nonempty) else 0
        raise DatasetError(f"{kind}; found list<{vtype}>", uri=source, column=column, row=first_row + row)
    if chunk_to_doc is not None and len(strings):
        strings = _chunks_to_docs(lists, strings, chunk_to_doc, column=column, source=source, first_row=first_row)
    mask = lists.is_null() if lists.null_count else None
    return pa.ListArray.from_arrays(pa.array(_offsets(lists).astype(np.int32)), strings, type=_IDS, mask=mask)


_RE_FLAGS = {re.IGNORECASE: "i", re.MULTILINE: "m", re.DOTALL: "s"}
_NO_DOC = pa.scalar(None, pa.string())


def _from_re(pattern: re.Pattern[str]) -> IdPattern:
    """A ``re.Pattern`` as the :class:`IdPattern` of its text and flags (IGNORECASE, MULTILINE, DOTALL)."""
    if pattern.groups != 1:
        raise ConfigError(
            f"the chunk-to-document pattern {pattern.pattern[:100]!r} has {pattern.groups} groups; it needs "
            r"exactly one, capturing the document id (e.g. '^(.+)::chunk-\d+$')"
        )
    flags = pattern.flags & ~(re.UNICODE | re.ASCII)
    inline = "".join(letter for flag, letter in _RE_FLAGS.items() if flags & flag)
    if flags & ~(re.IGNORECASE | re.MULTILINE | re.DOTALL):
        raise ConfigError(f"the chunk-to-document pattern {pattern.pattern[:100]!r}: only the flags i, m, s are read")
    try:
        return compile_id_pattern(f"(?{inline}){pattern.pattern}" if inline else pattern.pattern)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _documents(pattern: IdPattern, chunks: pa.Array) -> pa.Array:
    """Each chunk id's document id (null: no match, or the group captured nothing), by RE2 in linear time:
    Arrow's kernel for the whole array at once, else (a pattern the kernel refuses) id by id."""
    if pattern.kernel is not None:
        try:
            found = pc.extract_regex(chunks, pattern=pattern.kernel)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # an RE2 build older than the binding's: the binding's RE2, one id at a time
        else:
            docs = found.field(0)
            return pc.if_else(pc.and_(found.is_valid(), pc.greater(pc.binary_length(docs), 0)), docs, _NO_DOC)
    search = pattern.search
    return pa.array([search(chunk) or None for chunk in chunks.to_pylist()], pa.string())


def _chunks_to_docs(
    lists: pa.ListArray, strings: pa.Array, pattern: IdPattern, *, column: str, source: str, first_row: int
) -> pa.Array:
    """Each chunk id mapped to its document id, the pattern run once per distinct id."""
    encoded = pc.dictionary_encode(strings)
    docs = _documents(pattern, encoded.dictionary)
    if docs.null_count:  # no match, or the group captured nothing; the dictionary is in order of first appearance
        position = int(np.flatnonzero(np.asarray(docs.is_null()))[0])
        element = pc.equal(encoded.indices, pa.scalar(position, encoded.indices.type))
        chunk = encoded.dictionary[position].as_py()
        shown = pattern.pattern if len(pattern.pattern) <= 100 else f"{pattern.pattern[:100]}..."
        raise DatasetError(
            f"the chunk id {chunk[:80]!r}{'...' if len(chunk) > 80 else ''} does not match the chunk-to-document "
            f"pattern {shown!r} (or its group captured nothing)", uri=source, column=column,
            row=first_row + _first_row_with(lists, element),
        )  # fmt: skip
    return docs.take(encoded.indices)


def normalise_relevance(
    arr: pa.ListArray | pa.ChunkedArray, ids: pa.ListArray, *, column: str, source: str, first_row: int = 0
) -> pa.ListArray:
    """Graded relevance as ``list<int64>`` aligned with ``ids`` (the normalised relevant ids).

    A DatasetError naming the row for: a non-list column, non-integer grades (floats with a fraction, strings), a
    null grade, a negative grade, a list whose length differs from its ids'. A null list where ids are given means
    binary relevance 1 for that row's ids.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    typ = arr.type
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)):
        raise DatasetError(
            f"relevance is a list of non-negative integers aligned with the ids; found {typ}", uri=source,
            column=column, row=first_row,
        )  # fmt: skip
    if not pa.types.is_list(typ):
        arr = arr.cast(pa.list_(typ.value_type))
    if len(arr) != len(ids):
        raise ValueError(f"{column}: {len(arr)} relevance lists for {len(ids)} id lists")
    lists: pa.ListArray = arr
    values = lists.flatten()
    vtype = values.type
    if len(values) and values.null_count:
        row = _first_row_with(lists, values.is_null())
        raise DatasetError("a relevance grade is null", uri=source, column=column, row=first_row + row)
    if pa.types.is_floating(vtype):
        whole = pc.and_(pc.is_finite(values), pc.equal(pc.floor(values), values))
        if len(values) and not pc.all(whole).as_py():
            row = _first_row_with(lists, pc.invert(whole))
            raise DatasetError("a relevance grade is not an integer", uri=source, column=column, row=first_row + row)
    elif not (pa.types.is_integer(vtype) or (pa.types.is_null(vtype) and len(values) == 0)):
        row = _first_row_with(lists, pa.array(np.ones(len(values), bool))) if len(values) else 0
        raise DatasetError(
            f"relevance grades are non-negative integers; found list<{vtype}>", uri=source, column=column,
            row=first_row + row,
        )  # fmt: skip
    grades = values.cast(pa.int64())
    negative = pc.less(grades, 0)
    if len(grades) and pc.any(negative).as_py():
        row = _first_row_with(lists, negative)
        raise DatasetError("a relevance grade is negative", uri=source, column=column, row=first_row + row)
    rel_len = np.asarray(pc.list_value_length(lists).fill_null(-1))
    id_len = np.asarray(pc.list_value_length(ids).fill_null(0))
    bad = np.flatnonzero((rel_len != id_len) & (rel_len >= 0))
    if len(bad):
        row = int(bad[0])
        raise DatasetError(
            f"{rel_len[row]} relevance grades for {id_len[row]} ids (the lists are aligned)", uri=source,
            column=column, row=first_row + row,
        )  # fmt: skip
    offsets = pa.array(_offsets(lists).astype(np.int32))
    typed = pa.ListArray.from_arrays(offsets, grades, type=pa.list_(pa.int64()), mask=lists.is_null())
    if not lists.null_count:
        return typed
    # a null relevance list with ids: binary grade 1 for each of its ids
    ones = pa.array(np.ones(len(ids.flatten()), np.int64))
    fill = pa.ListArray.from_arrays(pa.array(_offsets(ids).astype(np.int32)), ones, type=pa.list_(pa.int64()))
    filled = pc.if_else(lists.is_null(), fill, typed)
    return filled.combine_chunks() if isinstance(filled, pa.ChunkedArray) else filled


# --- the metrics --------------------------------------------------------------------------------------------------


_CHUNK_IDS = 16_384  # retrieved ids per hashing chunk: its hash tables stay in cache


def _judged_ranks(retrieved: pa.ListArray, relevant: pa.ListArray, grades: Floats) -> tuple[Ints, Floats, Ints, Ints]:
    """One entry per (row, relevant id) pair, its highest grade kept: row, grade, and the id's rank in the row's
    retrieved list with repeats dropped (0: not retrieved); and per row, how many distinct ids it retrieved (0 for a
    row without judged ids).

    Done a chunk of rows at a time: both sides' ids get integer codes from one hash table per chunk (exact string
    equality, no global sort), a retrieved id's first occurrence in its row is its first (row, code) key, and each
    judged key is looked up among the row's retrieved keys.
    """
    n = len(retrieved)
    r_off, g_off = _offsets(retrieved), _offsets(relevant)
    r_values, g_values = retrieved.flatten(), relevant.flatten()
    per_chunk = max(1, _CHUNK_IDS * n // max(int(r_off[-1]), 1))
    rows_out: list[Ints] = []
    distinct = np.zeros(n, np.int64)
    grades_out: list[Floats] = []
    ranks_out: list[Ints] = []
    for lo in range(0, n, per_chunk):
        hi = min(n, lo + per_chunk)
        g_lo, g_hi = int(g_off[lo]), int(g_off[hi])
        if g_hi == g_lo:
            continue
        r_lo, r_hi = int(r_off[lo]), int(r_off[hi])
        g_rows = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(g_off[lo : hi + 1]))
        g_grade = grades[g_lo:g_hi]
        encoded = pc.dictionary_encode(
            pa.concat_arrays([r_values.slice(r_lo, r_hi - r_lo), g_values.slice(g_lo, g_hi - g_lo)])
        )
        codes = np.asarray(encoded.indices, dtype=np.int64)
        width = len(encoded.dictionary)
        g_key = g_rows * width + codes[r_hi - r_lo :]
        # one entry per judged (row, id): its highest grade
        order = np.lexsort((g_grade, g_key))
        last = np.ones(len(order), bool)
        last[:-1] = g_key[order][1:] != g_key[order][:-1]
        order = order[last]
        g_key, g_rows, g_grade = g_key[order], g_rows[order], g_grade[order]
        rank = np.zeros(len(g_key), np.int64)
        if r_hi > r_lo:
            r_rows = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(r_off[lo : hi + 1]))
            # the distinct (row, id) keys in order of first occurrence: the row's ranking with repeats dropped
            kept = pc.dictionary_encode(pa.array(r_rows * width + codes[: r_hi - r_lo])).dictionary
            kept_rows = np.asarray(kept, dtype=np.int64) // width
            distinct[lo:hi] = np.bincount(kept_rows, minlength=hi - lo)
            starts = np.searchsorted(kept_rows, np.arange(hi - lo, dtype=np.int64))
            found = pc.index_in(pa.array(g_key), value_set=kept)
            hit = np.asarray(found.is_valid())
            position = np.asarray(found.fill_null(0), dtype=np.int64)
            rank = np.where(hit, position - starts[g_rows] + 1, 0)
        rows_out.append(g_rows + lo)
        grades_out.append(g_grade)
        ranks_out.append(rank)
    if not rows_out:
        return np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64), distinct
    return np.concatenate(rows_out), np.concatenate(grades_out), np.concatenate(ranks_out), distinct


def _top_ranks(retrieved: pa.ListArray, relevant: pa.ListArray, grades: Floats, kmax: int) -> tuple[Ints, Floats, Ints]:
    """:func:`_judged_ranks` where only ranks up to ``kmax`` matter: each list is cut to its first ``2 * kmax`` ids,
    and only the rows where repeats left fewer than ``kmax`` distinct ids in that head are read whole again (a rank
    found in the head is exact: it depends only on the ids before it)."""
    cap = 2 * kmax
    lengths = _lengths(retrieved)
    if not len(lengths) or int(lengths.max()) <= cap:
        return _judged_ranks(retrieved, relevant, grades)[:3]
    rows, grade, rank, distinct = _judged_ranks(pc.list_slice(retrieved, 0, cap), relevant, grades)
    redo = np.flatnonzero((distinct < kmax) & (lengths > cap) & (_lengths(relevant) > 0))
    if not len(redo):
        return rows, grade, rank
    take = pa.array(redo)
    grade_lists = pa.ListArray.from_arrays(pa.array(_offsets(relevant).astype(np.int32)), pa.array(grades))
    sub_grades = np.asarray(grade_lists.take(take).flatten(), dtype=np.float64)
    sub = _judged_ranks(retrieved.take(take), relevant.take(take), sub_grades)
    keep = ~np.isin(rows, redo)
    return (
        np.concatenate([rows[keep], redo[sub[0]]]),
        np.concatenate([grade[keep], sub[1]]),
        np.concatenate([rank[keep], sub[2]]),
    )


def _within_row_rank(rows: Ints, n: int) -> Ints:
    """1-based position of each element within its row (``rows`` non-decreasing)."""
    if len(rows) == 0:
        return np.zeros(0, np.int64)
    starts = np.searchsorted(rows, np.arange(n, dtype=np.int64))
    return np.arange(len(rows), dtype=np.int64) - starts[rows] + 1


def id_metrics(
    retrieved: pa.ListArray, relevant: pa.ListArray, relevance: pa.ListArray | None, ks: Sequence[int]
) -> pa.Table:
    """Per row, ``recall@k``, ``precision@k``, ``hit_rate@k``, ``mrr@k`` and ``ndcg@k`` for each k (float64 columns
    named as :func:`metric_names`; definitions in the module docstring). Inputs as :func:`normalise_ids` and
    :func:`normalise_relevance` return them; rows not assessed are null."""
    ks = list(dict.fromkeys(int(k) for k in ks))
    if not ks or any(k <= 0 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks}")
    retrieved, relevant = (a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in (retrieved, relevant))
    retrieved, relevant = (a if a.type == _IDS else a.cast(_IDS) for a in (retrieved, relevant))
    n = len(retrieved)
    if len(relevant) != n or (relevance is not None and len(relevance) != n):
        raise ValueError("retrieved, relevant and relevance must have one list per row each")
    if relevance is None:
        grades: Floats = np.ones(int(_offsets(relevant)[-1]), np.float64)
    else:
        if isinstance(relevance, pa.ChunkedArray):
            relevance = relevance.combine_chunks()
        grades = np.asarray(relevance.flatten().cast(pa.float64()), dtype=np.float64)
        if len(grades) != int(_offsets(relevant)[-1]) or not np.array_equal(_lengths(relevance), _lengths(relevant)):
            raise ValueError("relevance lists must be aligned with the relevant ids")
    rows, grade, rank = _top_ranks(retrieved, relevant, grades, max(ks))
    positive = grade > 0
    rows, grade, rank = rows[positive], grade[positive], rank[positive]
    num_rel = np.bincount(rows, minlength=n).astype(np.float64)
    first_rank = np.full(n, np.inf)
    seen = rank > 0
    np.minimum.at(first_rank, rows[seen], rank[seen].astype(np.float64))
    gain = np.zeros(len(rank))
    gain[seen] = grade[seen] / np.log2(rank[seen] + 1.0)
    # ideal DCG: each row's grades, highest first
    order = np.lexsort((-grade, rows))
    i_rows = rows[order]
    i_rank = _within_row_rank(i_rows, n)
    i_gain = grade[order] / np.log2(i_rank + 1.0)

    columns: dict[str, list[Floats]] = {m: [] for m in METRICS}
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in ks:
            in_k = seen & (rank <= k)
            hits = np.bincount(rows[in_k], minlength=n).astype(np.float64)
            dcg = np.bincount(rows[in_k], weights=gain[in_k], minlength=n)
            i_in = i_rank <= k
            idcg = np.bincount(i_rows[i_in], weights=i_gain[i_in], minlength=n)
            columns["recall"].append(hits / num_rel)
            columns["precision"].append(hits / k)
            columns["hit_rate"].append((hits > 0).astype(np.float64))
            columns["mrr"].append(np.where(first_rank <= k, 1.0 / first_rank, 0.0))
            columns["ndcg"].append(dcg / idcg)
    mask = num_rel == 0
    out: dict[str, Any] = {}
    for metric in METRICS:
        for k, values in zip(ks, columns[metric], strict=True):
            out[f"{metric}@{k}"] = pa.array(values, pa.float64(), mask=mask)
    return pa.table(out)
