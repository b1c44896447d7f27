"""The process a run lives in: the Prefect API it talks to, SIGINT/SIGTERM, console logging kept quiet.

``run_flow._run`` (the ``run`` and ``demo`` commands) enters each of these for the length of one run.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

from recall_tasks._gc import raise_thresholds
from recall_tasks.cli.common import err


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection while a run starts up (its imports, the pre-flight, the head start's first
    requests), until :func:`freeze_heap`: start-up allocates ~200,000 objects that live as long as the process,
    and the collections they trigger walked them again and again (~0.3 s of CPU before the first request).
    ``run`` pauses before it reads its options (the table format detection imports pyarrow), ``_run`` again.

    The collector is on again when the block ends, however: a ``run`` that stops before :func:`freeze_heap`
    (``--dry-run``, a refused option) leaves a process that goes on (the command called in process:
    ``CliRunner``, a notebook) with its collector on."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``), then let it run again.

    A run's process holds ~200,000 long-lived objects after its imports (openai's types, pydantic models,
    Prefect): every full collection walked them all, ~0.8 s of a 1,000-row run's CPU. The CLI freezes once
    Prefect is imported (its exit skips the interpreter's finalization altogether: :func:`exit_process`):
    frozen objects are still freed by reference counting; only a reference cycle among them stays until the
    process ends, which a command of seconds to minutes can afford. Deployments do not (their flow process is
    Prefect's).
    """
    gc.freeze()
    raise_thresholds()  # and a run's own collections rarer (recall_tasks/_gc.py)
    gc.enable()


def exit_process(code: int) -> NoReturn:
    """End the ``recall-bench`` process with ``code`` the way the interpreter's own exit would, minus its
    finalization: non-daemon threads joined (``threading._shutdown``, executors' workers included), ``atexit``
    handlers run (Prefect's log and event flushes, logging's shutdown, ``weakref.finalize``), stdout and stderr
    flushed, then ``os._exit``.

    Why not ``sys.exit``: Arrow's worker threads release a scan's last buffers after the scan returned, and
    buffers read through a Python filesystem (Delta's storage handler, fsspec) need the GIL to be freed. When
    that lands after finalization began, the thread is torn down inside a C++ destructor and the process
    aborts ("terminate called without an active exception", exit 134) after a command that succeeded:
    ``recall-bench history`` 5 times in ~85 with the other core busy. Module teardown and C++ static
    destructors are what is skipped; nothing of ours relies on them (files are closed by ``with``).
    """
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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

    On the local server a run sends no flow-run heartbeats: nothing there reads them (they feed a "zombie flow"
    automation, which a server has only if someone created it), and the engine stops their thread at the end of
    the flow by joining it while it sleeps in 1 s steps, ~0.5 s of every run's wall time. A configured
    ``PREFECT_API_URL`` (a shared server, Prefect Cloud) keeps Prefect's default.
    """
    from recall_tasks.cli import server

    url, local = server.api_url_for_run(on_boot=_announce_boot)
    if not local:
        _check_reachable(url)
        yield
        return
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    err.print(f"[dim]Prefect: local server, UI {url.removesuffix('/api')}[/]", highlight=False)
    # live: sets Prefect's own setting for the run (read by Prefect and any Settings() it builds), then restores it
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
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
def _interrupts() -> Iterator[dict[str, Any]]:
    """SIGINT and SIGTERM for the length of a run: the first one raises in the main thread, repeats are ignored.

    The first SIGINT raises KeyboardInterrupt, the first SIGTERM :class:`_Terminated` (while the flow runs,
    Prefect's engine holds SIGTERM and raises its TerminationSignal, then re-sends the signal to this handler).
    The flow's chunk loop turns either into an abort (judge calls cancelled, row cache flushed); a second
    Ctrl-C during that clean-up would interrupt it half-way (what logged "client has been closed" errors), so
    it is ignored unless the clean-up hangs past ``FORCE_EXIT_AFTER_S``. Inside :func:`interrupts_deferred` the
    first signal still cancels the judge calls at once, but its exception waits for the block's end.
    """
    state: dict[str, Any] = {"signal": None, "at": 0.0, "defer": 0, "pending": False}

    def handler(signum: int, frame: Any) -> None:
        if state["signal"] is not None:
            if time.monotonic() - state["at"] > FORCE_EXIT_AFTER_S:
                err.print("interrupted again: exiting without finishing the clean-up")
                os._exit(128 + int(state["signal"]))
            return
        state["signal"], state["at"] = signum, time.monotonic()
        from recall_tasks._sync import cancel_all_scopes

        cancel_all_scopes()  # judge calls stop now, not when the exception reaches the flow's chunk loop
        if state["defer"]:
            state["pending"] = True  # raised by interrupts_deferred when its block ends
            return
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
def interrupts_deferred(state: dict[str, Any]) -> Iterator[None]:
    """The first SIGINT/SIGTERM that lands inside the block is raised when the block ends, not inside it.

    For imports (``state``: :func:`_interrupts`'). An exception raised inside an import lands wherever the main
    thread is: inside pydantic's schema building, pydantic-core turns a KeyboardInterrupt into a ``SchemaError``
    (an Exception), and Prefect's import catches that ("Failed to initialize plugins", with a traceback on the
    console) and goes on, so Ctrl-C in the first seconds of a run printed a traceback (1 loaded test run in ~200).
    An interrupted import can also leave a module half-initialised for the threads already judging. The handler
    still cancels the judge calls at once: only the exception waits, for as long as the import takes.
    """
    state["defer"] += 1
    try:
        yield
    finally:
        state["defer"] -= 1
    if not state["defer"] and state["pending"]:
        state["pending"] = False
        raise _interrupt_for(state["signal"])


class _OwnWarnings(logging.Filter):
    """recall-bench's own warnings, less the notes the CLI printed before the flow (the flow logs them again for
    deployment runs: not twice on the console)."""

    def __init__(self, printed: Iterable[str] = ()) -> None:
        super().__init__()
        self.printed = frozenset(printed)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("recall_tasks") or record.levelno < logging.WARNING:
            return False
        return record.getMessage() not in self.printed


@contextlib.contextmanager
def _quiet_prefect_console(debug: bool, printed: Iterable[str] = ()) -> Iterator[None]:
    """Console logging shows only recall-bench's own warnings for the run (``--debug``: everything).

    Flow-run and task-run logs still go to the Prefect API (the UI shows them); the CLI prints its own summary,
    progress and one-line errors. Without this, a run printed Prefect's state lines and, on any failure, its
    tracebacks. Only console (stream) handlers are filtered, and only while the run lasts.
    """
    handlers: list[logging.Handler] = []
    own = _OwnWarnings(printed)
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
