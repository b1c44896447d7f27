"""A few rows of a dataset looked up by position, for reports: their retrieval context, their question.

Each row is given as (file URI, 0-based row in the file) with what the run recorded of it (its content hash, its
row id): a row whose file was rewritten since the run no longer matches and is left out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import replace
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.io.blocks import group_starts, identity_hash, open_file, role_block
from recall_tasks.io.datasets import Dataset

T = TypeVar("T")


def _rows(ds: Dataset, refs: list[tuple[str, int, T]], columns: list[str]) -> Iterator[tuple[str, int, pa.Table, T]]:
    """Each referenced row that exists: (file URI, row, the row as a one-row table of ``columns``, its ``T``);
    each needed row group is read once."""
    by_file: dict[str, list[tuple[int, T]]] = {}
    for uri, row, tag in refs:
        by_file.setdefault(uri, []).append((row, tag))
    files = {f.uri: f for f in ds.files}
    for uri, wanted in by_file.items():
        f = files.get(uri)
        if f is None:
            continue
        with open_file(ds, f) as pf:
            starts = group_starts(pf)
            by_group: dict[int, list[tuple[int, T]]] = {}
            for row, tag in wanted:
                if 0 <= row < starts[-1]:
                    by_group.setdefault(bisect.bisect_right(starts, row) - 1, []).append((row, tag))
            for group, members in by_group.items():
                yield from _rows_of_group(pf, group, starts[group], members, columns, uri)


#: Rows decoded at a time when a row group is searched for a few rows (:func:`_rows_of_group`).
LOOKUP_BATCH_ROWS = 1024


def _rows_of_group(
    pf: pq.ParquetFile, group: int, start: int, members: list[tuple[int, T]], columns: list[str], uri: str
) -> Iterator[tuple[str, int, pa.Table, T]]:
    """The rows ``members`` of row group ``group`` (its first row ``start``), decoded :data:`LOOKUP_BATCH_ROWS`
    rows at a time up to the last one wanted.

    ``read_row_group`` decoded the whole group for a few rows: ~150 MB for a 50,000-row group of questions and
    contexts, the largest allocation of a 100,000-row run's end (the HTML report's worst rows' chunks, issue 42
    item 3); this holds one batch.
    """
    pending = sorted(members, key=lambda member: member[0])
    offset = start
    batches = pf.iter_batches(batch_size=LOOKUP_BATCH_ROWS, row_groups=[group], columns=columns, use_threads=False)
    for batch in batches:
        end = offset + batch.num_rows
        while pending and pending[0][0] < end:
            row, tag = pending.pop(0)
            yield uri, row, pa.Table.from_batches([batch.slice(row - offset, 1)]), tag
        if not pending:
            return
        offset = end


def read_contexts(ds: Dataset, refs: list[tuple[str, int, str | None]]) -> dict[tuple[str, int], list[str]]:
    """The retrieval context of a few rows, by (file URI, 0-based row in the file), for reports.

    A row is returned only when its content still hashes to the ``content_hash`` the run recorded: the
    dataset file may have been rewritten since (a re-index), and showing today's chunks beside last week's
    verdicts would mislead. Contexts supplied at run time (retriever, retrieval results) never match.
    """
    out: dict[tuple[str, int], list[str]] = {}
    roles_only = replace(ds, passthrough=[])
    for uri, row, one, digest in _rows(ds, refs, list(dict.fromkeys(ds.columns.values()))):
        block = role_block(roles_only, uri, row, one, ds.columns)
        if block.content_hashes[0] == digest:
            out[(uri, row)] = [c or "" for c in block.table.column("retrieval_context")[0].as_py() or []]
    return out


def read_questions(ds: Dataset, refs: list[tuple[str, int, str]]) -> dict[str, str]:
    """The question of a few rows by row id, from (file URI, 0-based row in the file, row id), for reports.

    A row is returned only when it still has that id (its ``row_id`` value, or the hash of its question and
    reference answer): the file may have been rewritten since the run. Unlike :func:`read_contexts` the contexts
    may differ (a run with ``--retrieval-uri``): a question does not depend on them.
    """
    if "input" not in ds.columns:
        return {}
    cols = [c for c in (ds.columns.get("row_id"), ds.columns.get("input"), ds.columns.get("expected_output")) if c]
    out: dict[str, str] = {}
    for _, _, one, row_id in _rows(ds, refs, list(dict.fromkeys(cols))):
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
