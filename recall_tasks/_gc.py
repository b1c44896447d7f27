"""Garbage collection while a run judges: young collections rarer, full collections far rarer.

A chunk's rows stay alive for about a second (their coroutines, requests, replies, outcomes): long enough to
outlive two young collections, so CPython's default thresholds ``(700, 10, 10)`` promoted ~100,000 objects a
second to the oldest generation and ran a full collection about twice a second. Each walked the ~400,000 objects
a run holds (~170 ms) and found ~20 objects of cyclic garbage: a third of a 300,000-row run's CPU, and the more
a run held the more each cost (measured with ``gc.callbacks`` in a ``benchmarks/scale.py`` run; the figures
before and after are ``benchmarks/gc_cost.py --latency 0``'s, in docs/performance.md).

:data:`RUN_THRESHOLDS` keep what reference counting cannot free (a cycle) collected, only later: a young
collection every 20,000 allocations instead of 700, a full one after 100 middle ones instead of 10. A run's
cyclic garbage is small (~20 objects a full collection), so memory does not grow with it.

Thresholds are the process's: :func:`run_thresholds` raises them for the length of a run (``pipeline/conduct``)
and puts back what it found when the last run of the process leaves (runs may overlap in one process, on
threads). A threshold a user raised further stays; ``gc.set_threshold(0)`` (collection off) stays off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: (young, middle, full) thresholds while a run judges; see the module docstring.
RUN_THRESHOLDS = (20_000, 10, 100)

_lock = threading.Lock()
_runs = 0
_found: tuple[int, ...] = ()


def raised(found: tuple[int, ...]) -> tuple[int, ...]:
    """The thresholds a run uses given the process's ``found``: each at least :data:`RUN_THRESHOLDS`' value;
    ``found`` whole when its first is 0 (collection switched off by its owner)."""
    if found[0] == 0:
        return found
    return tuple(max(a, b) for a, b in zip(found, RUN_THRESHOLDS, strict=True))


def raise_thresholds() -> None:
    """Raise the process's thresholds for good (a process that is one run: the CLI's ``run``)."""
    gc.set_threshold(*raised(gc.get_threshold()))


@contextmanager
def run_thresholds() -> Iterator[None]:
    """:data:`RUN_THRESHOLDS` (at least) for the length of the block; the first of overlapping blocks saves the
    process's thresholds, the last to leave restores them."""
    global _runs, _found
    with _lock:
        if _runs == 0:
            _found = gc.get_threshold()
            gc.set_threshold(*raised(_found))
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0:
                gc.set_threshold(*_found)
