"""One protocol for the three table formats an output can hold (``--format delta|parquet|iceberg``).

:class:`~recall_tasks.io.results.ResultStore` keeps the output's layout (chunk files, markers, reports) and hands
every table write, read and maintenance step to the output's :class:`TableBackend`:

- :class:`~recall_tasks.io.delta.DeltaBackend`: one Delta table per name, appends made once per commit id by a
  Delta app transaction; maintenance compacts, checkpoints and vacuums;
- :class:`~recall_tasks.io.parquet.ParquetBackend`: Hive-partitioned Parquet files; the ``runs`` file of a run
  is its commit marker; nothing to maintain (files are never rewritten);
- :class:`~recall_tasks.io.iceberg_backend.IcebergBackend`: tables in a pyiceberg catalog; maintenance compacts,
  expires snapshots and deletes orphan files.

Two helpers every backend shares: :func:`retry_commits` (a commit that lost a race with another writer's commit
is tried again on the fresh table, up to a limit each caller keeps as it was) and :func:`row_groups` (a run's
rows handed on in tables of :data:`BATCH_ROWS` rows, which bounds the memory of one commit).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

if TYPE_CHECKING:  # pyarrow (and numpy) stay out of the CLI's start-up: `maintain` imports this module
    import pyarrow as pa
    import pyarrow.dataset as pads

log = logging.getLogger(__name__)

TableName = Literal["results", "runs", "comparisons", "calibrations"]
TABLES: tuple[TableName, ...] = ("results", "runs", "comparisons", "calibrations")

#: rows per Arrow table a run's rows are handed on in (a Parquet file, one Iceberg ``append``)
BATCH_ROWS = 250_000

#: what is appended: a function returning the rows, called again for each attempt (a reader streams once)
Rows = Callable[[], "pa.RecordBatchReader | pa.Table"]

T = TypeVar("T")


class TableBackend(Protocol):
    """What :class:`~recall_tasks.io.results.ResultStore` needs of a table format."""

    def append(
        self, table: TableName, rows: Rows | None, *, commit_id: str, key: tuple[str, str], partition: dict[str, str]
    ) -> None:
        """Append ``rows()`` to ``table`` in one commit, unless ``commit_id`` is committed already.

        ``key``: the (column, value) naming the commit's rows (``run_id``, ``comparison_id``...); ``partition``: the
        partition the rows belong to (column -> value; Parquet's Hive folders, the ``results`` table's partition
        columns elsewhere). ``rows`` None: a run without rows (Parquet still makes the partition's folder)."""
        ...

    def read(self, table: TableName) -> pads.Dataset | None:
        """The committed rows of ``table`` (None: no such table yet)."""
        ...

    def maintain(self, table: TableName, keep_days: float, started: dt.datetime) -> dict[str, Any] | None:
        """Compact and clean ``table`` (``recall-bench maintain``, :mod:`~recall_tasks.io.maintenance`); a
        summary row, None when there is no such table or this format rewrites nothing. ``started``: when
        ``maintain`` started."""
        ...


def retry_commits(
    what: str,
    attempt: Callable[[int], T],
    *,
    attempts: int,
    conflicts: tuple[type[BaseException], ...],
    landed: Callable[[], bool] | None = None,
    give_up: Callable[[BaseException], BaseException] | None = None,
    pause_s: float = 0.0,
    logger: logging.Logger = log,
) -> T | None:
    """``attempt(n)`` for n = 0, 1...: again after each commit conflict (another writer committed first), at most
    ``attempts`` times in all; then the last conflict is raised (or ``give_up(conflict)``, raised from it).

    ``landed``: asked after each conflict, the last one included: True when the commit this attempt was making
    turns out to be made (by a concurrent writer of the same commit): the result is then None, nothing retried.
    ``pause_s``: seconds to wait before retry n+1, times n+1 (none by default).
    """
    for n in range(attempts):
        try:
            return attempt(n)
        except conflicts as exc:
            if landed is not None and landed():
                return None
            if n == attempts - 1:
                if give_up is None:
                    raise
                raise give_up(exc) from exc
            logger.info("%s: commit conflict (%s); retrying on the new table version", what, exc)
            if pause_s:
                time.sleep(pause_s * (n + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def row_groups(batches: Iterable[pa.RecordBatch], schema: pa.Schema, rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
    """``batches`` gathered into tables of at least ``rows`` rows (the last one smaller), in order."""
    import pyarrow as pa

    group: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        group.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(group, schema)
            group, count = [], 0
    if group:
        yield pa.Table.from_batches(group, schema)
