"""Handing the C heap's free pages back to the system while a run judges (glibc's ``malloc_trim``).

A run's rows come and go by the thousand a second: requests, replies, verdicts. What stays is small (the key
index and the dedup digests, ~28 bytes a row; docs/performance.md), yet the run's resident memory crept with its
rows: the few long-lived allocations land between short-lived ones, the pages around them stay free but
resident, and glibc returns only the heap's top to the system on its own. ``malloc_trim(0)`` releases every
whole free page of every arena (``madvise``) without moving anything; a call takes milliseconds, so every
:data:`TRIM_EVERY_S` costs a fraction of a percent of a run. ``benchmarks/scale.py`` prints the creep
(docs/performance.md, "1,000,000 rows").

:func:`trim_heap` is called between chunks (``pipeline/window``) and after a worker process's chunk
(``pipeline/workers``), at most every :data:`TRIM_EVERY_S`, and once after the commit, before the report reads
its rows back. Elsewhere than glibc (macOS, musl, Windows) it does
nothing: their allocators return memory their own way, and no other allocator's call is made in its place.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable
from functools import cache

#: Seconds between two trims from the chunk loop.
TRIM_EVERY_S = 2.0

_lock = threading.Lock()
_last = -float("inf")


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the process's own C library, already loaded
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "malloc_trim"):
        return None  # not glibc: another C library's malloc_trim (if any) is not assumed to behave alike
    trim = libc.malloc_trim
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def available() -> bool:
    """Whether this process's C library can trim its heap (glibc)."""
    return _malloc_trim() is not None


def trim_heap(every_s: float = 0.0) -> bool:
    """Return the heap's free pages to the system, unless one did less than ``every_s`` seconds ago (any
    thread's call counts). True when this call trimmed."""
    global _last
    trim = _malloc_trim()
    if trim is None:
        return False
    with _lock:
        now = time.monotonic()
        if now - _last < every_s:
            return False
        _last = now
    trim(0)
    return True
