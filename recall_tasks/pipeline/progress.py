"""Rows settled inside the chunks being scored, for a progress display that moves with the rows.

The chunk loop reports progress when a chunk settles (``steps.notify_progress``: 500 rows at a time by default);
a bar drawn from that alone sat at ``0/?`` for the first chunk and then jumped. While a chunk is scored in this
process, :func:`counting_rows` tells the run's observer ``rows(seq, n)`` as its rows settle: the rows without a judge
call (cache hits, missing inputs) at once, then each judged row as its reply comes (``scoring.rows_settled``).
``(seq, None)`` forgets a chunk's count: when an attempt to score it starts (a retry counts from zero) and when it
settles (``window.score_chunks``, just before ``progress`` counts its rows in the settled total). The count was
once forgotten when the scoring ended: a head start's chunk, scored long before the flow settles it, then left
the bar standing still and jumping by 500 (3,000 rows: 599 -> 805 -> 1323). Chunks scored in other processes
(``--task-runner processes|dask``) report when they settle only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

#: Told ``n`` as rows of the block being scored settle: set by the chunk's thread (:func:`counting_rows`), read by
#: ``scoring.score_rows`` on the loop (the coroutine runs in a copy of that thread's context).
rows_settled: ContextVar[Callable[[int], None] | None] = ContextVar("rows_settled", default=None)


class RowsObserver(Protocol):
    def rows(self, seq: int, n: int | None) -> None: ...


@contextlib.contextmanager
def counting_rows(seq: int, observer: RowsObserver | None) -> Iterator[None]:
    """Tell ``observer`` the rows of chunk ``seq`` as they settle while the block is scored (nothing without one)."""
    if observer is None:
        yield
        return
    observer.rows(seq, None)  # an attempt (a retry too) counts from zero
    token = rows_settled.set(functools.partial(observer.rows, seq))
    try:
        yield
    finally:
        rows_settled.reset(token)


def tell_each(tasks: list[asyncio.Task[Any]], tell: Callable[[int], None] | None) -> None:
    """``tell(1)`` as each of the rows' ``tasks`` ends (nothing when no one listens)."""
    if tell is None:
        return
    told = tell

    def one(_: asyncio.Task[Any]) -> None:
        told(1)

    for task in tasks:
        task.add_done_callback(one)


class RowProgress:
    """What a progress bar shows: rows of settled chunks plus rows settled in the chunks not settled yet, never
    less than it showed before."""

    def __init__(self) -> None:
        self.done = 0
        self.total: int | None = None
        self.partial: dict[int, int] = {}
        self.shown = 0

    def chunks(self, done: int, total: int) -> int:
        self.done, self.total = done, total
        return self._show()

    def rows(self, seq: int, n: int | None) -> int:
        if n is None:
            self.partial.pop(seq, None)
        else:
            self.partial[seq] = self.partial.get(seq, 0) + n
        return self._show()

    def _show(self) -> int:
        now = self.done + sum(self.partial.values())
        if self.total is not None:
            now = min(now, self.total)
        self.shown = max(self.shown, now)
        return self.shown
