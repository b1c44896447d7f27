"""The guard behind the ``concurrency`` mark (tests/concurrency_guard.py) sees what a test starts while it runs."""

from __future__ import annotations

import socket
import threading

import pytest

from tests import concurrency_guard


@pytest.mark.concurrency
def test_the_guard_records_a_listening_socket_and_racing_threads():
    """Without the mark this test would fail, naming both (the guard wraps every test's call)."""
    before = len(concurrency_guard._seen)
    threading.Barrier(2)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
    assert concurrency_guard._seen[before:] == ["racing threads (threading.Barrier)", "a listening socket"]


def test_a_thread_started_by_a_library_is_not_a_race():
    """The library's own threads (Prefect, executors) start in most tests: only a barrier marks a race."""
    before = len(concurrency_guard._seen)
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
    assert concurrency_guard._seen[before:] == []
