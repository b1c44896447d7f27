"""A small async rate limiter for requests and tokens per minute, optionally fed by a fleet-wide grant source.

Both limits are a continuous leaky bucket: a caller asking for ``amount`` waits until the bucket has room.
It lives on one event loop (the judge keeps one per loop).

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
from dataclasses import dataclass
from typing import Protocol

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
    """Allows ``per_minute`` units per minute with a burst of at most one second's worth (at least 1).

    With a ``source``, every unit is also taken from grants of ``grant`` units that the source hands out
    (fleet-wide); without one, this process alone is limited, as before fleet limits existed.
    """

    def __init__(self, per_minute: float, source: GrantSource | None = None, grant: int = 1) -> None:
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate, 1.0)
        self._level = self.capacity
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()
        self.source = source
        self.grant = max(1, grant)
        self._balance = 0.0
        self._granted_at = 0.0
        #: grants acquired, units granted, units that expired unspent (for logs and benchmarks)
        self.acquires = 0
        self.granted = 0
        self.expired = 0.0

    async def acquire(self, amount: float = 1.0) -> None:
        """Wait until ``amount`` units fit; an amount above capacity waits for a full bucket, then goes."""
        async with self._lock:
            amount = min(amount, self.capacity)
            while True:
                now = time.monotonic()
                self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._level >= amount:
                    self._level -= amount
                    break
                await asyncio.sleep((amount - self._level) / self.rate)
            if self.source is not None:
                await self._spend(amount)

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
