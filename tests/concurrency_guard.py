"""The ``concurrency`` mark, kept true by the suite itself (hooks imported by tests/conftest.py).

``make test-flaky N=20`` repeats the tests marked ``concurrency``: those that start servers, clusters, processes or
signals, or races threads, where the flaky failures live (a port taken, a child slower under load, a signal landing
early, a race lost the other way round). A mark
set by hand is forgotten, so while a test runs (its call, not the shared fixtures' set-up) this module watches
for a child process (``subprocess``, ``multiprocessing``: process pools, Dask nannies), a signal sent
(``os.kill``, ``os.killpg``, ``signal.raise_signal``), a listening socket (a server of the test's own) and a
``threading.Barrier`` (threads lined up to race; the library has none), and fails
a test that did any of these without the mark, naming what it started. Tests that use a module-scoped server
fixture (its set-up is outside the call) are marked here from their fixtures.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

#: Module-scoped fixtures that start servers or processes: every test that uses one is marked from this list
#: (a module fixture is set up once, in its first test's set-up; the guard fails that test if one is missing here)
PROCESS_FIXTURES = {
    "prefect_server",
    "prefect_worker",
    "cluster",
    "installed_wheel",
    "clone",
    "judge_url",
    "webhook_receiver",
}

_STARTED = pytest.StashKey[set[str]]()
_seen: list[str] = []
_watching = threading.Event()


def _watch(owner: Any, name: str, what: str) -> Callable[[], None]:
    original = getattr(owner, name)

    def watched(*args: Any, **kwargs: Any) -> Any:
        if _watching.is_set():
            _seen.append(what)
        return original(*args, **kwargs)

    setattr(owner, name, watched)
    return lambda: setattr(owner, name, original)


@contextlib.contextmanager
def watching(node: pytest.Item, label: str) -> Iterator[None]:
    """Record in ``node``'s stash what runs inside the block starts (nested: the outer block records)."""
    if _watching.is_set():
        yield
        return
    undo = [
        _watch(subprocess.Popen, "__init__", "a subprocess"),
        _watch(multiprocessing.process.BaseProcess, "start", "a child process"),
        _watch(os, "kill", "a signal (os.kill)"),
        _watch(os, "killpg", "a signal (os.killpg)"),
        _watch(signal, "raise_signal", "a signal (signal.raise_signal)"),
        _watch(socket.socket, "listen", "a listening socket"),
        _watch(threading.Barrier, "__init__", "racing threads (threading.Barrier)"),
    ]
    _seen.clear()
    _watching.set()
    try:
        yield
    finally:
        _watching.clear()
        for restore in reversed(undo):
            restore()
        started = node.stash.setdefault(_STARTED, set())
        started.update(f"{what} ({label})" for what in _seen)


def mark_from_fixtures(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.concurrency)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    """Function- and module-scoped fixtures count for the test being set up; the session's shared servers don't."""
    item = getattr(request, "_pyfuncitem", None)  # the test being set up (request.node is the scope's node)
    if fixturedef.scope == "session":  # shared servers; also when a fixture asks for one (getfixturevalue)
        paused = _watching.is_set()
        _watching.clear()
        try:
            return (yield)
        finally:
            if paused:
                _watching.set()
    if not isinstance(item, pytest.Item):
        return (yield)
    with watching(item, f"fixture {fixturedef.argname}"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with watching(item, "the test"):
        result = yield
    started = sorted(item.stash.get(_STARTED, set()))
    if started and item.get_closest_marker("concurrency") is None:
        if report := os.environ.get("RECALL_BENCH_CONCURRENCY_REPORT"):  # list the tests to mark, fail none
            with open(report, "a") as f:
                f.write(f"{item.nodeid}\t{'; '.join(started)}\n")
            return result
        pytest.fail(
            f"{item.nodeid} started {'; '.join(started)} without the concurrency mark: add "
            "@pytest.mark.concurrency (or a module fixture's name to PROCESS_FIXTURES in tests/concurrency_guard.py), "
            "so that make test-flaky repeats it",
            pytrace=False,
        )
    return result
