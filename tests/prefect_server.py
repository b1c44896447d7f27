"""A real Prefect server and a real process worker, each in its own process group, for deployment tests.

``prefect_server`` (module) runs ``prefect server start`` on a free port of 127.0.0.1 with SQLite in a
temporary ``PREFECT_HOME``, analytics and UI off, every service at its default (scheduler, triggers,
actions...), and yields a :class:`PrefectServer`; ``prefect_worker`` (module) creates the process work
pool ``recall-pool`` and runs ``prefect worker start --pool recall-pool --type process`` from the
repository root with the SeaweedFS credentials in its environment and no OpenAI key.

Nothing here changes the test process's environment or Prefect settings: every child gets an explicit
environment built by :func:`clean_env` (the parent's variables minus ``PREFECT_*``, ``AWS_*`` and
``OPENAI_*``), so the in-process ``prefect_test_harness`` of other tests is left alone. Use it in a test
module (or a conftest)::

    from tests import prefect_server as _prefect

    prefect_server = _prefect.prefect_server
    prefect_worker = _prefect.prefect_worker
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fixture_scope import module_unless_repeated
from tests.s3_server import S3Server

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "recall-pool"
SERVER_START_TIMEOUT_S = 120.0
WORKER_START_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
_DROPPED_PREFIXES = ("PREFECT_", "AWS_", "OPENAI_", "AZURE_OPENAI_")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """The parent's environment without Prefect, AWS and OpenAI settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_PREFIXES)}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def _migrated_database() -> Path:
    """Where a database migrated by the installed Prefect is kept between test servers (one per Prefect version).

    A new server's empty SQLite database costs ~8 s of CPU in migrations (about half of a test server's boot on a
    2-core machine); a copy of a migrated one starts in well under a second, the migrations finding nothing to do.
    """
    import prefect

    versions = Path(prefect.__file__).parent / "server" / "database" / "_migrations" / "versions" / "sqlite"
    names = sorted(p.name for p in versions.glob("*.py"))
    digest = hashlib.sha256("\n".join([prefect.__version__, *names]).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"recall-bench-prefect-{digest}.db"


def seed_database(path: Path) -> None:
    """Copy the migrated database (if one was kept) to ``path``, a new server's database file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copyfile(_migrated_database(), path)


def keep_migrated_database(db: Path) -> None:
    """Keep a copy of ``db``, which a server has just migrated (and holds nothing else yet), for the next servers.

    Prefect's migrations on start still run on every copy (a newer Prefect brings its own migrations), and only a
    complete copy that passes SQLite's check replaces the kept one, so a bad copy costs time, never a test.
    """
    kept = _migrated_database()
    if kept.exists() or not db.exists():
        return
    partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
    try:
        with contextlib.closing(sqlite3.connect(db)) as src, contextlib.closing(sqlite3.connect(partial)) as dst:
            src.backup(dst)
            (ok,) = dst.execute("PRAGMA quick_check").fetchone()
        if ok == "ok":
            os.replace(partial, kept)
    except (OSError, sqlite3.Error):
        pass
    finally:
        partial.unlink(missing_ok=True)


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite+aiosqlite:///<path>`` database URL (None for another database)."""
    prefix = "sqlite+aiosqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


def _tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log, without uvicorn's access lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join([line for line in text if "uvicorn.access" not in line][-lines:])


def _stop_group(proc: subprocess.Popen[bytes] | None, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the child's process group (it was started in a new session), then SIGKILL after ``grace``."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError):  # children that outlived their leader (a worker's flow runs)
        os.killpg(proc.pid, signal.SIGKILL)


class PrefectServer:
    """A running ``prefect server start`` (SQLite under ``home``)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.log_path = home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def server_env(self) -> dict[str, str]:
        return clean_env(
            PREFECT_HOME=str(self.home / "server-home"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_SERVER_UI_ENABLED="false",
            PREFECT_SERVER_LOGGING_LEVEL="INFO",
            PREFECT_LOGGING_LEVEL="INFO",
        )

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a CLI or worker process talking to this server (own client PREFECT_HOME)."""
        return clean_env(
            PREFECT_HOME=str(self.home / "client-home"),
            PREFECT_API_URL=self.api_url,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            **extra,
        )

    def start(self, timeout: float = SERVER_START_TIMEOUT_S) -> None:
        cmd = [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(self.port), "--no-ui"]
        database = self.home / "server-home" / "prefect.db"  # Prefect's default under the server's PREFECT_HOME
        seed_database(database)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=self.server_env(), cwd=self.home,
                start_new_session=True,
            )  # fmt: skip
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited early ({self.proc.returncode}):\n{self.log_tail()}")
            if self.healthy():
                self.startup_seconds = time.monotonic() - t0
                keep_migrated_database(database)
                return
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"prefect server did not answer {self.api_url}/health in {timeout} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                return resp.status == 200 and json.loads(resp.read() or b"null") is True
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        _stop_group(proc)

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def cli(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 180.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``prefect <args>`` from the repository root against this server; raise with its output on error."""
        full_env = self.env(PYTHONPATH=str(REPO), **dict(env or {}))
        done = subprocess.run(
            [PREFECT, "--no-prompt", *args], env=full_env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"prefect {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def automation_failures(self) -> list[str]:
        """Reasons of failed automation actions (e.g. a trigger's template that did not render)."""
        body = json.dumps({"filter": {"event": {"name": ["prefect.automation.action.failed"]}}}).encode()
        request = urllib.request.Request(
            f"{self.api_url}/events/filter", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            found = json.loads(resp.read())
        return [str(e.get("payload", {}).get("reason")) for e in found.get("events", [])]

    def client(self) -> Any:
        """A sync Prefect client bound to this server (no global settings touched)."""
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(self.api_url)


class PrefectWorker:
    """A running ``prefect worker start --pool <pool> --type process``."""

    def __init__(self, server: PrefectServer, log_dir: Path, env: Mapping[str, str], pool: str = POOL) -> None:
        self.server = server
        self.pool = pool
        self.log_path = log_dir / "worker.log"
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    def start(self, timeout: float = WORKER_START_TIMEOUT_S) -> None:
        cmd = [PREFECT, "worker", "start", "--pool", self.pool, "--type", "process", "--name", "recall-test-worker"]
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO, start_new_session=True
            )
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect worker exited early ({self.proc.returncode}):\n{self.log_tail()}")
            if self._online():
                self.startup_seconds = time.monotonic() - t0
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect worker did not come online in {timeout} s:\n{self.log_tail()}")

    def _online(self) -> bool:
        from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus

        with self.server.client() as client:
            try:
                workers = client.read_workers_for_work_pool(
                    self.pool, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
                )
            except Exception:  # noqa: BLE001 - the pool may not exist yet
                return False
        return bool(workers)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        _stop_group(proc)

    def log_tail(self, lines: int = 80) -> str:
        return _tail(self.log_path, lines)


@pytest.fixture(scope=module_unless_repeated)
def prefect_server() -> Iterator[PrefectServer]:
    """A real Prefect server (SQLite, temporary home) for a module; its process group is killed at the module's end.

    Not for the session: an idle server's services still take ~4 % of a core, ~20 s of CPU over the rest of a
    ``make test`` run on the worker that ran tests/test_deployments.py.
    """
    home = Path(tempfile.mkdtemp(prefix="rb-prefect-server-"))
    server = PrefectServer(home)
    try:
        server.start()
        print(f"\n[prefect_server] {server.api_url} up in {server.startup_seconds:.1f} s (log {server.log_path})")
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope=module_unless_repeated)
def prefect_worker(prefect_server: PrefectServer, s3_server: S3Server) -> Iterator[PrefectWorker]:
    """A process worker on ``recall-pool`` started from the repository root (S3 credentials, no OpenAI key)."""
    prefect_server.cli("work-pool", "create", POOL, "--type", "process", "--overwrite")
    log_dir = Path(tempfile.mkdtemp(prefix="rb-prefect-worker-"))
    env = prefect_server.env(
        **s3_server.env(),
        PYTHONPATH=str(REPO),
        RECALL_BENCH_HOME=str(REPO),
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_HEARTBEAT_SECONDS="5",
        PREFECT_LOGGING_LEVEL="INFO",
    )
    worker = PrefectWorker(prefect_server, log_dir, env)
    try:
        worker.start()
        print(f"[prefect_worker] online in {worker.startup_seconds:.1f} s (log {worker.log_path})")
        yield worker
    finally:
        worker.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
