"""Run coroutines from sync code on one background event loop.

The sync API (``metric.measure``, the Prefect chunk tasks) calls the async code path through
:func:`run_sync`, so there is a single implementation. All such calls share one long-lived loop in a daemon
thread: judges keep their HTTP clients (bound to a loop) across calls and across chunk threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="recall-bench-loop", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the shared background loop and wait for its result (from any thread)."""
    loop = _background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("run_sync called from the background loop itself; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
