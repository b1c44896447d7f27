"""The process a run lives in: the Prefect API it talks to, SIGINT/SIGTERM, console logging kept quiet.

``run_flow._run`` (the ``run`` and ``demo`` commands) enters each of these for the length of one run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from recall_tasks.cli.common import err

if TYPE_CHECKING:
    from recall_tasks._sync import CancelScope


def _announce_boot(info: Any) -> None:
    err.print(
        f"starting the local Prefect server (first run only, takes a few seconds): UI {info.ui_url}\n"
        "  it keeps running for the next runs; `recall-bench server stop` stops it, "
        "PREFECT_API_URL points runs at another server"
    )


def _check_reachable(url: str) -> None:
    """A configured ``PREFECT_API_URL`` that answers nothing fails in one line, before the run writes anything."""
    from recall_tasks.cli import server

    reason = server.unreachable(url)
    if reason:
        raise server.ServerError(
            f"the Prefect API at {url} (PREFECT_API_URL) cannot be reached ({reason}); start that server, "
            "or unset PREFECT_API_URL to use recall-bench's local server"
        )


@contextlib.contextmanager
def _prefect_api() -> Iterator[None]:
    """Point this process at ``PREFECT_API_URL`` if configured, else at the local server (started if needed).

    Never Prefect's temporary in-process server (see ``recall_tasks/server.py``). A configured URL that refuses
    connections fails here in one line, not after the Prefect client's retries. The local server's URL is set
    for the length of the run both in the environment (read by any ``Settings()`` built later) and as Prefect's
    current settings (the ones built when ``prefect`` was imported lack it); both are restored afterwards.
    """
    from recall_tasks.cli import server

    url, local = server.api_url_for_run(on_boot=_announce_boot)
    if not local:
        _check_reachable(url)
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    err.print(f"[dim]Prefect: local server, UI {url.removesuffix('/api')}[/]", highlight=False)
    # live: sets Prefect's own setting for the run (read by Prefect and any Settings() it builds), then restores it
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous


class _Terminated(BaseException):
    """SIGTERM outside Prefect's own handler, raised in the main thread as KeyboardInterrupt is for SIGINT."""


#: A repeated signal while an interrupted run cleans up is ignored, unless the clean-up takes longer than this.
FORCE_EXIT_AFTER_S = 10.0


@contextlib.contextmanager
def _interrupts(scope: CancelScope | None = None) -> Iterator[dict[str, Any]]:
    """SIGINT and SIGTERM for the length of a run: the first one raises in the main thread, repeats are ignored.

    The first SIGINT raises KeyboardInterrupt, the first SIGTERM :class:`_Terminated` (while the flow runs,
    Prefect's engine holds SIGTERM and raises its TerminationSignal, then re-sends the signal to this handler);
    ``scope``'s judge calls (this run's, no other) are cancelled at once. The flow's chunk loop turns either into
    an abort (judge calls cancelled, row cache flushed); a second Ctrl-C during that clean-up would interrupt it
    half-way (what logged "client has been closed" errors), so it is ignored unless the clean-up hangs past
    ``FORCE_EXIT_AFTER_S``: then the signal's default action ends the process.
    """
    state: dict[str, Any] = {"signal": None, "at": 0.0}

    def handler(signum: int, frame: Any) -> None:
        if state["signal"] is not None:
            if time.monotonic() - state["at"] > FORCE_EXIT_AFTER_S:
                err.print("interrupted again: exiting without finishing the clean-up")
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        state["signal"], state["at"] = signum, time.monotonic()
        if scope is not None:
            scope.cancel()  # judge calls stop now, not when the exception reaches the flow's chunk loop
        raise _interrupt_for(signum)

    if threading.current_thread() is not threading.main_thread():  # signals can only be handled there
        yield state
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            # an interrupted run is on its way out (exit 130/143): a repeated Ctrl-C must not turn that into a
            # KeyboardInterrupt traceback on the way, so the handler stays (it ignores repeats, forces after 10 s)
            if state["signal"] is None:
                signal.signal(sig, old)


def _interrupt_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else _Terminated()


@contextlib.contextmanager
def signals_default() -> Iterator[None]:
    """SIGINT's default action for the block (the process ends at once): for imports before a run has anything to
    clean up. A KeyboardInterrupt raised inside Prefect's import lands in pydantic's schema building, which turns
    it into an Exception that Prefect's plugin loader catches, prints with a traceback and goes on from."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _OwnWarnings(logging.Filter):
    """recall-bench's own warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith("recall_tasks") and record.levelno >= logging.WARNING


@contextlib.contextmanager
def _quiet_prefect_console(debug: bool) -> Iterator[None]:
    """Console logging shows only recall-bench's own warnings for the run (``--debug``: everything).

    Flow-run and task-run logs still go to the Prefect API (the UI shows them); the CLI prints its own summary,
    progress and one-line errors. Without this, a run printed Prefect's state lines and, on any failure, its
    tracebacks. Only console (stream) handlers are filtered, and only while the run lasts.
    """
    handlers: list[logging.Handler] = []
    own = _OwnWarnings()
    if not debug:
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", []):
                console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
                if console and not any(isinstance(f, _OwnWarnings) for f in handler.filters):
                    handler.addFilter(own)
                    handlers.append(handler)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(own)


def _is_interrupt(exc: BaseException) -> bool:
    """KeyboardInterrupt, our SIGTERM, Prefect's TerminationSignal, or a chunk's RunInterrupted."""
    from recall_tasks.errors import RunInterrupted

    if isinstance(exc, KeyboardInterrupt | _Terminated | RunInterrupted):
        return True
    return type(exc).__name__ == "TerminationSignal"
