"""Identical rows judged once: the judge requests in flight in one process, by row-cache key.

``scoring.score_rows`` leads a key's request or waits for the one in flight; a run's chunks share one
:class:`SharedRequests` (``RunResources.shared``) on the one event loop their judge calls run on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from recall_tasks.judges.base import JudgeResponse

#: The flag of a row that took the verdict of an identical row's request (same row-cache key) in this run.
SHARED_FLAG = "verdict shared with an identical row of this run (no request of its own)"


@dataclass(frozen=True)
class Shared:
    """What a row's judge request ended with, for the identical rows waiting on it: the response and its latency,
    or the error, or why it was not judged."""

    response: JudgeResponse | None = None
    latency_ms: float = 0.0
    error: str | None = None
    not_judged: str | None = None
    cached: bool = False  # the response came from the row cache


class SharedRequests:
    """The judge requests in flight in this process by row-cache key: one request per key, however many rows.

    A run's chunks share one (``RunPlan.shared``) and one event loop, so a row whose key is already being judged by
    another chunk waits for that request instead of sending its own. An entry goes when its request ends: later
    rows find the verdict in the row cache (errors are never shared past the request: a rerun judges them again).
    """

    def __init__(self) -> None:
        self._inflight: dict[str, asyncio.Future[Shared]] = {}

    def lead(self, key: str) -> asyncio.Future[Shared] | None:
        """None: the caller judges ``key`` (and says by which task: :meth:`led_by`); else the request to wait for."""
        found = self._inflight.get(key)
        if found is not None:
            return found
        self._inflight[key] = asyncio.get_running_loop().create_future()
        return None

    def served(self, key: str, response: JudgeResponse) -> None:
        """The leader of ``key`` found it in the row cache: its waiters take that."""
        self._resolve(key, Shared(response=response, cached=True))

    def drop(self, key: str) -> None:
        """The leader of ``key`` stopped before judging it: its waiters are cancelled."""
        future = self._inflight.pop(key, None)
        if future is not None and not future.done():
            future.cancel()

    def _resolve(self, key: str, result: Shared) -> None:
        future = self._inflight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(result)

    def led_by(self, key: str, task: asyncio.Task[Shared]) -> None:
        """``task`` judges ``key``: when it ends (also cancelled before it started), its waiters get its end."""
        task.add_done_callback(lambda done: self._settle(key, done))

    def _settle(self, key: str, task: asyncio.Task[Shared]) -> None:
        future = self._inflight.pop(key, None)
        if future is None or future.done():
            return
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(task.exception())  # type: ignore[arg-type]
            future.exception()  # retrieved: a key nobody waited for logs no "exception was never retrieved"
        else:
            future.set_result(task.result())
