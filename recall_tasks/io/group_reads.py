"""A Parquet row group read a block at a time (``ParquetFile.iter_batches``), never decoded whole.

A writer chooses its row groups (pyarrow's default holds up to a million rows): :func:`group_parts` streams a group
as the run's blocks (``io/blocks.iter_blocks``), :func:`group_rows` re-reads one block of it (``io/blocks.read_block``,
worker processes). An undecodable page is a DatasetError naming the file and the group.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.errors import DatasetError
from recall_tasks.io.datasets import Dataset
from recall_tasks.io.storage import read_error


def group_parts(
    ds: Dataset, uri: str, pf: pq.ParquetFile, g: int, offset: int, columns: list[str], block_rows: int
) -> Iterator[tuple[int, pa.Table]]:
    """Row group ``g`` as ``(first row in the group, rows)``: blocks of ``block_rows`` rows from the group's start
    (the last one shorter), decoded a block at a time (``iter_batches``), never the whole group at once.

    A row group is as large as its writer chose (pyarrow's default is a million rows): decoded whole, a 200,000-row
    group of the benchmarks' rows held ~340 MiB of Arrow memory; read this way, ~20. ``offset``: the group's first
    row in the file, for the error naming an undecodable group's rows.
    """
    batches = pf.iter_batches(batch_size=block_rows, row_groups=[g], columns=columns)
    pending: list[pa.RecordBatch] = []
    have = start = 0
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowInvalid, OSError) as exc:
            last = offset + pf.metadata.row_group(g).num_rows - 1
            raise read_error(exc, uri, f"row group {g} (rows {offset}-{last}) cannot be read", fs=ds.fs) from None
        if batch is not None and batch.num_rows:
            pending.append(batch)
            have += batch.num_rows
        while have >= block_rows or (batch is None and have):
            table = pa.Table.from_batches(pending)
            part = table.slice(0, block_rows)
            yield start, part
            start += part.num_rows
            rest = table.slice(part.num_rows)
            pending, have = rest.to_batches(), rest.num_rows
        if batch is None:
            return


def group_rows(
    ds: Dataset, uri: str, pf: pq.ParquetFile, g: int, columns: list[str], start: int, rows: int
) -> pa.Table:
    """Rows ``start`` to ``start + rows`` of row group ``g``: its batches decoded in order up to the last of them,
    none held but those rows (a Parquet column chunk is decoded from its start; the rows after are not read)."""
    batches = pf.iter_batches(batch_size=max(rows, 1), row_groups=[g], columns=columns)
    kept: list[pa.RecordBatch] = []
    at = 0
    try:
        for batch in batches:
            lo, hi = max(start - at, 0), min(start + rows - at, batch.num_rows)
            if hi > lo:
                kept.append(batch.slice(lo, hi - lo))
            at += batch.num_rows
            if at >= start + rows:
                break
    except (pa.ArrowInvalid, OSError) as exc:
        raise read_error(exc, uri, f"row group {g} cannot be read", fs=ds.fs) from None
    if not kept:
        raise DatasetError(f"row group {g} has no row {start}: the file changed during the run", uri=uri)
    return pa.Table.from_batches(kept)
