"""Shared fixtures: the fake OpenAI server, SeaweedFS, an isolated Prefect.

No test needs a key or the internet: OPENAI_* variables are cleared so nothing can reach a real endpoint.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

os.environ.pop("OPENAI_API_KEY", None)
os.environ.pop("OPENAI_BASE_URL", None)
_PREFECT_HOME = tempfile.mkdtemp(prefix="recall-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# a test that runs the CLI without PREFECT_API_URL must never start (or stop) a server in the user's own state
# directory, whatever RECALL_BENCH_STATE_DIR the caller has: the session gets its own
_STATE_DIR = tempfile.mkdtemp(prefix="recall-state-")
os.environ["RECALL_BENCH_STATE_DIR"] = _STATE_DIR

from tests import concurrency_guard, scheduling  # noqa: E402
from tests.concurrency_guard import mark_from_fixtures  # noqa: E402
from tests.fake_openai import fake_openai, fake_openai_server  # noqa: E402,F401
from tests.s3_server import s3_bucket, s3_server  # noqa: E402,F401
from tests.scheduling import (  # noqa: E402,F401
    order_and_group,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server (SQLite) for the whole session, its new database a copy of a migrated one.

    In-process flow runs send no heartbeats (none of these tests reads them): the engine joins their thread at
    the end of each flow run while it sleeps in 1 s steps, ~0.5 s of every in-process run.
    """
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        temporary_settings,
    )
    from prefect.testing import utilities

    from tests.prefect_server import keep_migrated_database, seed_database, sqlite_path

    def seeded_mkdtemp(*args, **kwargs) -> str:  # the harness's database is prefect-test.db in its mkdtemp()
        path = tempfile.mkdtemp(*args, **kwargs)
        seed_database(Path(path) / "prefect-test.db")
        return path

    with contextlib.ExitStack() as stack:
        with mock.patch.object(utilities, "mkdtemp", seeded_mkdtemp):
            stack.enter_context(utilities.prefect_test_harness(server_startup_timeout=120))
        database = sqlite_path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
        if database is not None:
            keep_migrated_database(database)
        stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_local_server_left_behind():
    """Stop a local Prefect server that a test may have started in the session's state directory."""
    yield
    from recall_tasks.cli import server

    server.stop()
    shutil.rmtree(_STATE_DIR, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    scheduling.pytest_configure(config)
    # a plugin, not this conftest's hooks: a conftest's hooks never see the session fixtures' set-up (their node is
    # the session, outside tests/), which the guard must tell apart from a test's own servers
    if not config.pluginmanager.has_plugin("recall-concurrency-guard"):
        config.pluginmanager.register(concurrency_guard, "recall-concurrency-guard")
    # Prefect's vendored croniter runs `file -b <python>` once, when first imported (platform.architecture()): in
    # whichever test imports it first, which the guard then fails for a subprocess it never asked for (the test that
    # imported prefect.cli.deploy first, depending on the worker's order). Imported here, before any test.
    import prefect._vendor.croniter  # noqa: F401

    # The openai SDK's first request names the platform (platform.platform()), which runs `uname -p` once per
    # process: in whichever test sends the session's first OpenAI request (test_outcomes' status history and
    # test_evaluate's cancel test, alone or first of a worker). platform caches the answer: asked here, before any
    # test.
    platform.platform()


#: Tests that need a real server process (Prefect, SeaweedFS) or run the CLI in subprocesses: ``integration``.
#: ``make test-fast`` runs the rest (pure functions, the in-thread fake OpenAI server); ``make test`` runs all.
_SERVER_FIXTURES = {"prefect_harness", "s3_server", "s3_bucket", "prefect_server"}
_PROCESS_MODULES = {
    "test_server",
    "test_interrupts",
    "test_run_errors",
    "test_startup",
    "test_deployments",
    "test_worker_state",
}


#: The files of the tests marked serial in this session's collection, before ``-m`` deselects any: ``make test``
#: runs them in a second step that collects only the Makefile's ``SERIAL_TESTS`` (checked in tests/test_readme.py)
SERIAL_FILES = pytest.StashKey[set[str]]()


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or module in _PROCESS_MODULES:
            item.add_marker(pytest.mark.integration)
    mark_from_fixtures(items)  # the concurrency mark of tests using a module fixture that starts processes
    config.stash[SERIAL_FILES] = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("serial")}
    order_and_group(config, items)  # longest first; a module fixture's tests on one worker (tests/scheduling.py)


def pytest_collection_finish(session):
    """Freeze what collection imported (recall-bench, Prefect, openai, pyarrow, the tests: ~410,000 objects per
    process) so the collector's full passes during the tests do not walk it again: -5 % of CPU on test_pipeline +
    test_caching (user 183 s -> 173 s, children included).
    """
    import gc

    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A full garbage collection after each test marked ``concurrency`` (the ones with servers, clients and
    processes; all of them with ``RECALL_BENCH_GC_EACH_TEST=1``), so that an unclosed socket's ResourceWarning
    fails the test that leaked it, at its teardown, instead of whichever later test happens to collect (the CLI's
    start-up collects, so an in-process CLI test took the blame). About 0.1 s a test."""
    yield
    if request.node.get_closest_marker("concurrency") or os.environ.get("RECALL_BENCH_GC_EACH_TEST") == "1":
        import gc

        gc.collect()
