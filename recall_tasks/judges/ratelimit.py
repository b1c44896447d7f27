"""A small async rate limiter for requests and tokens per minute, optionally fed by a fleet-wide grant source.

Both limits charge every amount in full, under two rules (:class:`RateLimiter`): a continuous leaky bucket of
one second's worth, which an amount larger than the bucket leaves in deficit (its caller waits until the rate has
paid it back), and a sliding minute (what went out in the last :data:`MINUTE_S` plus the amount stays within the
quota). What a request's reply did not use of its charge comes back (:meth:`RateLimiter.give_back`). It lives on
one event loop (the judge keeps one per loop).

Fleet-wide limits (``--rpm``/``--tpm`` shared by every process using the same limit key): the limiter also
spends a *grant balance* that a :class:`GrantSource` refills, a few hundred milliseconds' worth of the fleet's
rate per grant (:func:`fleet_shape`). Asking the source is one round trip to a shared server, far too slow per
request, so a request only waits on it when the balance is spent. The judges layer knows nothing of the source's
implementation (``recall_tasks.fleet.rate`` puts Prefect's global concurrency limits behind it).

Why the fleet's rate sits a little below the quota (:func:`fleet_shape`): a provider that enforces its
per-minute quota over short windows (``W``, assumed ``max(10 s, 20 requests)``) answers 429 to a burst. The
shared limit allows at most ``capacity + rate × W`` units in any window, and grants still unspent when a window
opens add at most one grant (a balance expires ``GRANT_S`` after its last grant), so
``rate = quota - (capacity + grant) / W`` keeps every window within the quota.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

#: The window a per-minute quota is counted over locally: a minute, plus a second for the time between leaving the
#: limiter and reaching the server (a provider counts arrivals, which may come a little closer than the sends).
MINUTE_S = 61.0
#: Seconds' worth of the fleet's rate one grant carries (and how long an unspent balance stays valid).
GRANT_S = 0.25
#: The shortest window a provider is assumed to enforce a per-minute quota over (longer for small quotas).
WINDOW_S = 10.0
WINDOW_REQUESTS = 20
#: At least this many slots of the shared limit per grant (:class:`FleetShape`'s ``scale``).
SLOTS_PER_GRANT = 100
#: Grants the shared limit holds at once (its burst): one in use while the next is acquired, and room for
#: processes that ask a little late (each grant is two round trips to the server).
CAPACITY_GRANTS = 3


class GrantSource(Protocol):
    """Where a limiter gets more budget: ``grant(n)`` returns once ``n`` units are granted to this caller;
    ``aclose()`` releases what the source holds on the running loop (the judge's ``aclose`` calls it)."""

    name: str

    async def grant(self, amount: int) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class FleetShape:
    """A fleet-wide limit: ``rate`` units/s on average, ``grant`` units per acquire, bursts of ``capacity``.

    ``scale``: slots of the shared limit per unit. Prefect decays a limit's slots in whole slots from its last
    write (``floor``), so each acquire loses half a slot of decay on average: 10 % of a 5-request grant, 0.1 %
    when a request is 10 slots.
    """

    rate: float
    grant: int
    capacity: int
    scale: int = 1


def fleet_shape(per_minute: float) -> FleetShape:
    """The shared limit for a quota of ``per_minute`` units: see the module docstring for the margin."""
    if per_minute <= 0:
        raise ValueError("a rate limit must be positive")
    quota = per_minute / 60.0
    grant = max(1, round(quota * GRANT_S))
    capacity = CAPACITY_GRANTS * grant
    window = max(WINDOW_S, WINDOW_REQUESTS / quota)
    rate = quota - (capacity + grant) / window
    return FleetShape(rate=rate, grant=grant, capacity=capacity, scale=max(1, math.ceil(SLOTS_PER_GRANT / grant)))


def limit_key(base_url: str | None, model: str) -> str:
    """The default key of a fleet limit: a short hash of the endpoint and the model (never the URL itself).

    The URL's query and fragment are left out (a query may carry a token); ``None`` is OpenAI's API.
    """
    url = (base_url or "https://api.openai.com/v1").split("#", 1)[0].split("?", 1)[0].rstrip("/").lower()
    return hashlib.sha256(f"{url}\x00{model}".encode()).hexdigest()[:12]


class RateLimiter:
    """Allows ``per_minute`` units per minute; every amount is charged in full.

    Two rules hold before a caller goes. A leaky bucket of one second's worth (at least 1) smooths the rate: an
    amount larger than the bucket leaves it in deficit, and its caller waits until the rate has paid the deficit
    back (a 3,000-token request at ``--tpm 30000`` waits 6 s: its share, not the 1 s a cap at the bucket's size
    gave it, which let through 6x the quota). A sliding minute keeps any :data:`MINUTE_S` of sends within
    ``per_minute``: the bucket alone allows its burst, plus a large request paid for before a window opened, on top
    of a minute's rate. An amount larger than the whole quota waits for an empty minute, then goes alone.

    With a ``source``, every unit is also taken from grants of ``grant`` units that the source hands out
    (fleet-wide; a large amount takes several grants); without one, this process alone is limited.
    """

    def __init__(self, per_minute: float, source: GrantSource | None = None, grant: int = 1) -> None:
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.per_minute = float(per_minute)
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate, 1.0)
        self._level = self.capacity  # below zero: a deficit the rate pays back before anyone else goes
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()
        self._sent: deque[list[float]] = deque()  # [when, amount] of the last MINUTE_S
        self._in_window = 0.0
        self.source = source
        self.grant = max(1, grant)
        self._balance = 0.0
        self._granted_at = 0.0
        #: grants acquired, units granted, units that expired unspent (for logs and benchmarks)
        self.acquires = 0
        self.granted = 0
        self.expired = 0.0

    async def acquire(self, amount: float = 1.0) -> list[float]:
        """Wait until ``amount`` units are paid for (bucket, minute, fleet grants), then count them as sent; returns
        the send's record for :meth:`give_back`."""
        async with self._lock:
            now = time.monotonic()
            self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
            self._stamp = now
            self._level -= amount
            if self._level < 0:
                await asyncio.sleep(-self._level / self.rate)
            await self._fit_minute(amount)
            if self.source is not None:
                await self._spend(amount)
            sent = [time.monotonic(), amount]
            self._sent.append(sent)
            self._in_window += amount
            return sent

    def give_back(self, sent: list[float], unused: float) -> None:
        """``unused`` of a send's amount was not used (a reply shorter than the completion limit): the bucket and
        the minute's window get it back, so the next requests go sooner. Fleet grants spent stay spent."""
        unused = min(max(unused, 0.0), sent[1])
        if not unused:
            return
        sent[1] -= unused
        if sent[0] > time.monotonic() - MINUTE_S and self._sent and sent[0] >= self._sent[0][0]:
            self._in_window = max(self._in_window - unused, 0.0)
        self._level = min(self.capacity, self._level + unused)

    async def _fit_minute(self, amount: float) -> None:
        """Wait until the last :data:`MINUTE_S` of sends plus ``amount`` fit in ``per_minute``."""
        while self._sent:
            now = time.monotonic()
            while self._sent and self._sent[0][0] <= now - MINUTE_S:
                self._in_window -= self._sent.popleft()[1]
            if not self._sent:
                self._in_window = 0.0  # no float drift left behind
                return
            if self._in_window + amount <= self.per_minute:
                return
            excess, wait_until = self._in_window + amount - self.per_minute, now
            for at, sent in self._sent:  # the sends that must leave the window first
                excess -= sent
                wait_until = at + MINUTE_S
                if excess <= 0:
                    break
            await asyncio.sleep(max(wait_until - now, 0.001))

    async def _spend(self, amount: float) -> None:
        assert self.source is not None
        if self._balance and time.monotonic() - self._granted_at > GRANT_S:
            self.expired += self._balance  # held too long: spending it now could burst past a short window
            self._balance = 0.0
        while self._balance < amount:
            await self.source.grant(self.grant)
            self._balance += self.grant
            self._granted_at = time.monotonic()
            self.acquires += 1
            self.granted += self.grant
        self._balance -= amount
