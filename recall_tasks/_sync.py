"""Run coroutines from sync code on one background event loop.

The sync API (``metric.measure``, the Prefect chunk tasks) calls the async code path through
:func:`run_sync`, so there is a single implementation. All such calls share one long-lived loop in a daemon
thread: judges keep their HTTP clients (bound to a loop) across calls and across chunk threads.

A :class:`CancelScope` groups the calls of one run so that cancelling the run stops all of them at once, from
any thread, including calls that have not started yet (a chunk thread that starts after the cancel is refused).
Each run has its own scope (``RunResources.scope``; a caller may pass it in to cancel that run and no other):
nothing here cancels every run of the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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


class CancelScope:
    """Coroutines run through one scope; :meth:`cancel` cancels those in flight and refuses new ones.

    Cancelling a future of ``run_coroutine_threadsafe`` cancels its task on the loop: awaited HTTP requests are
    aborted (their connections closed), ``finally`` blocks run. The waiting thread gets :class:`Cancelled`. A
    waiting thread interrupted itself (KeyboardInterrupt in the main thread) cancels the coroutine it waited for.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self.cancelled = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Like :func:`run_sync`, unless the scope is cancelled (then :class:`Cancelled`, nothing run)."""
        loop = _background_loop()
        if threading.current_thread() is _thread:
            coro.close()
            raise RuntimeError("CancelScope.run called from the background loop itself; await the coroutine instead")
        with self._lock:
            if self.cancelled:
                coro.close()
                raise Cancelled("cancelled before it started")
            future = asyncio.run_coroutine_threadsafe(coro, loop)
            self._futures.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise Cancelled("cancelled while running") from None
        except BaseException:
            future.cancel()  # the waiting thread was interrupted: what it waited for stops too (a no-op once done)
            raise
        finally:
            with self._lock:
                self._futures.discard(future)

    def __reduce__(self) -> tuple[type[CancelScope], tuple[()]]:
        """Another process gets a scope of its own: Prefect pickles a flow run's parameters (a scope among them)
        into the context of every task run it sends to a worker process, and cancelling is this process's."""
        return (CancelScope, ())

    def cancel(self) -> int:
        """Cancel every coroutine in flight and refuse new ones; returns how many were cancelled."""
        with self._lock:
            self.cancelled = True
            futures = list(self._futures)
        return sum(f.cancel() for f in futures)


class Cancelled(Exception):
    """A coroutine of a cancelled :class:`CancelScope`."""
