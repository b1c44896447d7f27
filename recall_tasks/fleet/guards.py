"""The run's guards around judge calls: the spending :class:`Budget` and the outage :class:`CircuitBreaker`.

Both are shared by every chunk of a run (one per worker process with ``--task-runner processes|dask``, where
:class:`~recall_tasks.fleet.budget.FleetBudget` extends the budget to the whole run) and used on the one
event loop the judge calls run on; ``scoring.score_rows`` consults them before and after each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any


class Budget:
    """Stops new judge calls once ``max_requests`` or ``max_cost_usd`` is reached (calls in flight finish).

    Shared by every chunk of a run; checked and updated on the one event loop the judge calls run on.

    A request is counted when its call is reserved, so ``max_requests`` is exact (plus the repairs of calls in
    flight). A call's cost is known only when it returns, so with ``max_cost_usd`` a call reserves its place only
    once one of ``max_in_flight`` (the run's ``--max-concurrency``) turns is free: every row of the chunks in
    flight starts its task at once, and without the turns each would have passed the check before the first
    answer came back (a 500-row chunk judged whole against a one-cent budget). The spend is then at most
    ``max_cost_usd`` plus the calls in flight when it was reached: ``max_in_flight`` calls.
    """

    def __init__(
        self, max_requests: int | None = None, max_cost_usd: float | None = None, *, max_in_flight: int | None = None
    ) -> None:
        self.max_requests = max_requests
        self.max_cost_usd = max_cost_usd
        self.requests = 0
        self.cost_usd = 0.0
        self.in_flight = 0
        self.exhausted_reason: str | None = None
        self.max_in_flight = max_in_flight if max_cost_usd else None
        self._turns: asyncio.Semaphore | None = None

    def acquire(self) -> bool:
        """Reserve one call; False (and the reason recorded) when the budget is spent."""
        if self.max_requests is not None and self.requests + self.in_flight >= self.max_requests:
            self.exhausted_reason = f"request budget reached (--max-requests {self.max_requests})"
        elif self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
            self.exhausted_reason = f"cost budget reached (--max-cost-usd {self.max_cost_usd:g})"
        else:
            self.in_flight += 1
            return True
        return False

    async def reserve(self) -> bool:
        """Reserve one call as the scoring loop does: wait for a turn (cost budgets), then :meth:`_reserve`."""
        if self.max_in_flight is not None:
            if self._turns is None:
                self._turns = asyncio.Semaphore(self.max_in_flight)
            await self._turns.acquire()
        if await self._reserve():
            return True
        if self._turns is not None:
            self._turns.release()
        return False

    async def _reserve(self) -> bool:
        """:meth:`acquire`; a fleet-wide budget may ask a server for more first."""
        return self.acquire()

    def release(self, requests: int, cost_usd: float | None) -> None:
        self.in_flight -= 1
        self.requests += requests
        self.cost_usd += cost_usd or 0.0
        if self._turns is not None:
            self._turns.release()


#: How the reason of a row kept from the judge (budget spent, breaker tripped) starts.
NOT_JUDGED = "not judged: "

#: Failed judge attempts in a row (retries included) that trip a run's circuit breaker.
BREAKER_THRESHOLD = 10

#: Judge requests in a row the endpoint rejected (4xx), none accepted in between, that trip the breaker: a
#: rejection every request meets (a model name or parameter the endpoint refuses), not one row's.
REJECTION_THRESHOLD = 10


class CircuitBreaker:
    """Stops judging when the endpoint is down: ``threshold`` failed attempts in a row, or ``timeout_threshold``
    timed-out attempts in a row.

    Attempts, not rows: a networked judge reports every HTTP attempt (the SDK's retries included) to
    :data:`~recall_tasks.judges.base.attempt_observer`. Failures are connection errors (refused, reset, DNS,
    TLS), timeouts and 5xx; any other answer resets the counts (the endpoint answers), a 429 counts neither way.
    Timeouts trip sooner (the run sets ``timeout_threshold`` to its concurrency, between 3 and ``threshold``):
    the calls in flight time out at about the same moment, so a hanging endpoint costs about one timeout for the
    whole run, not rows x attempts x timeout. When it trips, the calls in flight are cancelled and every row not
    judged yet is recorded "not judged" with :attr:`tripped_reason` (endpoint host and cause, no credentials).

    Rejections are counted per judge call, not per attempt (:meth:`request_rejected`, :meth:`request_answered`):
    one rejected row is that row's error, but ``rejection_threshold`` calls in a row rejected with none accepted
    in between is a rejection every request meets (a bad model name or parameter) and trips the breaker too.

    Shared by every chunk of a run, like :class:`Budget`; used only on the one event loop the judge calls run on.
    """

    def __init__(
        self,
        threshold: int = BREAKER_THRESHOLD,
        timeout_threshold: int | None = None,
        rejection_threshold: int = REJECTION_THRESHOLD,
    ) -> None:
        self.threshold = threshold
        self.timeout_threshold = min(timeout_threshold or threshold, threshold)
        self.rejection_threshold = rejection_threshold
        self.rejections = 0
        self.failures = 0
        self.timeouts = 0
        self.tripped_reason: str | None = None
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._attempts: dict[asyncio.Task[Any], int] = {}  # HTTP attempts made by each call in flight
        #: set when the run's first HTTP attempt goes out (the CLI's head start waits for it, from another thread)
        self.first_sent = threading.Event()

    def _count(self) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # called outside the judge loop (tests, a sync caller): nothing to attribute
            return
        if task is not None and task in self._in_flight:
            self._attempts[task] = self._attempts.get(task, 0) + 1

    def attempts_of(self, task: asyncio.Task[Any]) -> int:
        """HTTP attempts ``task`` made (a call cancelled while waiting for its turn made none)."""
        return self._attempts.get(task, 0)

    def attempt_sent(self) -> None:
        if not self.first_sent.is_set():
            self.first_sent.set()

    def attempt_ok(self) -> None:
        self._count()
        self.failures = self.timeouts = 0

    def attempt_failed(self, endpoint: str, cause: str, *, timed_out: bool = False) -> None:
        self._count()
        if self.tripped_reason is not None:
            return
        self.failures += 1
        self.timeouts += 1 if timed_out else 0
        if self.failures >= self.threshold or self.timeouts >= self.timeout_threshold:
            self.trip(
                f"judge endpoint {endpoint} failed {self.failures} attempts in a row (last: {cause}); "
                "judging stopped, the remaining rows were not judged"
            )

    def request_rejected(self, what: str) -> None:
        """A judge call the endpoint rejected (``what``: its error text, which names the endpoint and status)."""
        if self.tripped_reason is not None:
            return
        self.rejections += 1
        if self.rejections >= self.rejection_threshold:
            self.trip(
                f"the judge endpoint rejected {self.rejections} requests in a row and accepted none (last: {what}): "
                "a rejection every request meets (check --model and the endpoint's parameters); judging stopped, "
                "the remaining rows were not judged",
                spare_current=True,  # the call that told it has ended: its row keeps its error
            )

    def request_answered(self) -> None:
        """A judge call the endpoint accepted: rejections so far were those rows' own."""
        self.rejections = 0

    def trip(self, reason: str, *, spare_current: bool = False) -> None:
        """Record ``reason`` and cancel every judge call in flight (their rows become "not judged")."""
        self.tripped_reason = reason
        current = None
        if spare_current:
            with contextlib.suppress(RuntimeError):  # no loop: nothing in flight to spare
                current = asyncio.current_task()
        for task in self._in_flight:
            if task is not current and not task.done():
                self._cancelled.add(task)
                task.cancel()

    def enter(self, task: asyncio.Task[Any]) -> None:
        self._in_flight.add(task)

    def leave(self, task: asyncio.Task[Any]) -> bool:
        """Forget ``task``; True when the breaker cancelled it (its row is then "not judged")."""
        self._in_flight.discard(task)
        self._attempts.pop(task, None)
        if task in self._cancelled:
            self._cancelled.discard(task)
            return True
        return False
