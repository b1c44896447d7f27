"""A small async rate limiter for requests and tokens per minute.

Both limits are a continuous leaky bucket: a caller asking for ``amount`` waits until the bucket has room.
It lives on one event loop (the judge keeps one per loop).
"""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    """Allows ``per_minute`` units per minute with a burst of at most one second's worth (at least 1)."""

    def __init__(self, per_minute: float) -> None:
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate, 1.0)
        self._level = self.capacity
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

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
                    return
                await asyncio.sleep((amount - self._level) / self.rate)
