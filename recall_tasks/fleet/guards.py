"""The run's guards around judge calls: the spending :class:`Budget` and the outage :class:`CircuitBreaker`.

Both are shared by every chunk of a run (one per worker process with ``--task-runner processes|dask``, where
:class:`~recall_tasks.fleet.budget.FleetBudget` extends the budget to the whole run) and used on the one
event loop the judge calls run on; ``scoring.score_rows`` consults them before and after each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Protocol

from recall_tasks.judges.base import BudgetReached


class SpendLedger(Protocol):
    """Where a run's reservations are held beyond the process (``fleet/ledger.Ledger``): :meth:`cover` returns once
    it says the run reserved at least ``requests`` and ``cost_usd``."""

    async def cover(self, requests: int, cost_usd: float) -> None: ...


class Budget:
    """The run's ``max_requests`` and ``max_cost_usd``: every HTTP attempt is paid for before it is sent.

    Shared by every chunk of a run; checked and updated on the one event loop the judge calls run on.

    A judge call first reserves a place (:meth:`reserve`: refused once the budget is spent), then each HTTP
    attempt it sends (the first, SDK retries, the repair of an unusable reply, the retry of a truncated one) goes
    through its :class:`Call` (the judge's :class:`~recall_tasks.judges.base.AttemptGate`) as it is about to be
    sent: it reserves a request, and with ``max_cost_usd`` its worst case (its prompt tokens at most plus its
    completion limit at the price, ``OpenAIJudge.worst_cost``) before it goes out; when its reply is read the cost
    it did not use goes back. A reservation that does not fit waits while other
    attempts in flight hold reservations (they may give some back), and is refused once none do: the attempt is
    not sent (``BudgetReached``), the row is "not judged", the budget is spent. So ``requests <= max_requests``
    and ``cost <= max_cost_usd`` whatever is in flight. A call cancelled in flight keeps its reservation as spent.

    A judge that does not gate its attempts (no ``gates_attempts``: the lexical judge, a library judge) reserves
    one request per call and is charged the rest when its call returns.
    ``requests``/``cost_usd`` start from ``spent`` (what earlier attempts of a resumed run spent). With a
    :attr:`ledger` (the threads runner's, ``fleet/ledger.py``) each reservation is held there before the attempt
    goes out, so the caps hold across a SIGKILL and a rerun.
    """

    def __init__(
        self,
        max_requests: int | None = None,
        max_cost_usd: float | None = None,
        *,
        max_in_flight: int | None = None,
        spent: tuple[int, float] = (0, 0.0),
    ) -> None:
        self.max_requests = max_requests
        self.max_cost_usd = max_cost_usd
        self.requests, self.cost_usd = spent  # reserved requests; settled cost
        self.held_usd = 0.0  # worst cases reserved by attempts in flight
        self.holding = 0  # calls whose attempts hold a reservation (the count, free of float drift)
        self.in_flight = 0
        self.exhausted_reason: str | None = None
        self.max_in_flight = max_in_flight if max_cost_usd else None
        self._turns: asyncio.Semaphore | None = None
        self._changed: asyncio.Event | None = None
        self.ledger: SpendLedger | None = None

    @property
    def requests_reason(self) -> str:
        return f"request budget reached (--max-requests {self.max_requests})"

    @property
    def cost_reason(self) -> str:
        return f"cost budget reached (--max-cost-usd {self.max_cost_usd:g})"

    def acquire(self, call: Call | None = None) -> bool:
        """Reserve one call; False (and the reason recorded) when the budget is spent. An ungated call (``call``
        None or not gated) reserves its first request now; a gated one reserves each attempt as it is sent."""
        gated = call is not None and call.gated
        if self.exhausted_reason is not None and (gated or self.max_cost_usd is not None):
            return False
        if self.max_requests is not None and self.requests >= self.max_requests:
            self.exhausted_reason = self.requests_reason
        elif self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
            self.exhausted_reason = self.cost_reason
        else:
            self.in_flight += 1
            self.requests += 0 if gated else 1
            return True
        return False

    async def reserve(self, call: Call | None = None) -> bool:
        """Reserve one call as the scoring loop does: wait for a turn (cost budgets), then :meth:`_reserve`."""
        if self.max_in_flight is not None:
            if self._turns is None:
                self._turns = asyncio.Semaphore(self.max_in_flight)
            await self._turns.acquire()
        if await self._reserve(call):
            if self.ledger is not None and (call is None or not call.gated):  # a gated call covers each attempt
                try:
                    await self.ledger.cover(self.requests, self.cost_usd + self.held_usd)
                except BaseException:
                    self.release(1, 0.0, call)  # not started: its request stays counted
                    raise
            return True
        if self._turns is not None:
            self._turns.release()
        return False

    async def _reserve(self, call: Call | None = None) -> bool:
        """:meth:`acquire`; a fleet-wide budget may ask a server for more first."""
        return self.acquire(call)

    def call(self, gated: bool) -> Call:
        """The gate of one call (``gated``: a judge that sends its attempts through it, ``OpenAIJudge``)."""
        return Call(self, gated)

    def release(self, requests: int, cost_usd: float | None, call: Call | None = None) -> None:
        """A reserved call ended after ``requests`` attempts costing ``cost_usd``; ``call``: its gate, whose
        attempts were paid for already (a reservation still held, a call cancelled in flight, counts as spent)."""
        self.in_flight -= 1
        if call is not None and call.gated:
            self._settle(call, call.held, spent=True)
        else:
            self._charge(requests - 1, cost_usd or 0.0)
        if self._turns is not None:
            self._turns.release()

    def _charge(self, requests: int, cost_usd: float) -> None:
        """An ungated call's requests beyond its first and its cost, counted when it returned."""
        self.requests += requests
        self.cost_usd += cost_usd

    def _stop(self, reason: str) -> BudgetReached:
        self.exhausted_reason = self.exhausted_reason or reason
        self._notify()
        return BudgetReached(reason)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _changes(self) -> None:
        """Until an attempt in flight settles (or the budget is spent)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    async def _reserve_attempt(self, call: Call) -> None:
        self._settle(call, 0.0)  # an earlier attempt of this completion failed: it bills nothing
        if self.max_requests is not None and self.requests >= self.max_requests:
            raise self._stop(self.requests_reason)
        self.requests += 1
        worst = call.worst if self.max_cost_usd is not None else 0.0
        while self.max_cost_usd is not None and self.cost_usd + self.held_usd + worst > self.max_cost_usd:
            if not self.holding:
                self.requests -= 1  # not sent
                raise self._stop(self.cost_reason)
            await self._changes()
        self._hold(call, worst)
        if self.ledger is not None:  # held on the store before it is sent
            await self.ledger.cover(self.requests, self.cost_usd + self.held_usd)

    def _settle(self, call: Call, cost_usd: float, *, spent: bool = False) -> None:
        """``call``'s held reservation ends: ``cost_usd`` is what its attempts cost (``spent``: the held amount)."""
        if not call.holds and not cost_usd:
            return
        if call.holds:
            self.holding -= 1
        self.held_usd = self.held_usd - call.held if self.holding else 0.0
        self.cost_usd += call.held if spent else cost_usd
        call.held, call.holds = 0.0, False
        self._notify()

    def _hold(self, call: Call, worst: float) -> None:
        if not call.holds:
            self.holding += 1
        self.held_usd += worst
        call.held += worst
        call.holds = True


class Call:
    """One judge call's :class:`~recall_tasks.judges.base.AttemptGate` on a :class:`Budget`."""

    def __init__(self, budget: Budget, gated: bool) -> None:
        self.budget = budget
        self.gated = gated  # its attempts reserve through it (else the call is charged when it returns)
        self.worst = 0.0  # the worst case of an attempt of the completion being posted
        self.held = 0.0  # reserved by its attempts in flight
        self.held_units = 0  # the same in a fleet cost counter's micro-dollars
        self.holds = False  # counted in the budget's ``holding``
        self.armed = False
        self.reserves_cost = budget.max_cost_usd is not None  # its attempts reserve their worst case

    def arm(self, worst_usd: float) -> None:
        self.worst, self.armed = worst_usd, True

    async def reserve_attempt(self) -> None:
        if self.armed and self.gated:
            await self.budget._reserve_attempt(self)

    def settle(self, cost_usd: float) -> None:
        self.armed = False
        if self.gated:  # an ungated call is charged when it returns
            self.budget._settle(self, cost_usd)


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
        """HTTP attempts ``task`` sent, the one in flight included (a call cancelled while waiting for its turn sent
        none). Counted as each goes out (:meth:`attempt_sent`), not as it ends: an attempt in flight when the breaker
        trips reached the endpoint, which bills it, and is never told how it ended (its call is cancelled)."""
        return self._attempts.get(task, 0)

    def attempt_sent(self) -> None:
        self._count()
        if not self.first_sent.is_set():
            self.first_sent.set()

    def attempt_ok(self) -> None:
        self.failures = self.timeouts = 0

    def attempt_failed(self, endpoint: str, cause: str, *, timed_out: bool = False) -> None:
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
