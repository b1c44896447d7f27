"""The local Prefect server (``recall-bench server``) for real: real ``prefect server start`` processes, real CLI runs.

Every command is a subprocess with its own state directory (``RECALL_BENCH_STATE_DIR``), a free port
(``RECALL_BENCH_SERVER_PORT``), its own client ``PREFECT_HOME`` and no ``PREFECT_API_URL`` (unless a test sets
it), so nothing touches the user's ``~/.local/state/recall-bench`` or another test's Prefect. The module boots
one server in all (by a first ``run``; ``server start`` then finds it running); every server it starts is
stopped at the end, by ``server stop`` and then by killing the recorded process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prefect_server import REPO, clean_env, free_port, seed_database

BOOT_TIMEOUT_S = 400.0


class Local:
    """One state directory and port: the environment of every command of a test."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.state = root / "state"
        self.port = port or free_port()

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(
            PREFECT_HOME=str(self.root / "client-home"),
            RECALL_BENCH_STATE_DIR=str(self.state),
            RECALL_BENCH_SERVER_PORT=str(self.port),
            PYTHONPATH=str(REPO),
            **extra,
        )

    def cli(self, *args: str, timeout: float = BOOT_TIMEOUT_S, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "recall_tasks", *args], env=self.env(**extra), cwd=self.root,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def record(self) -> dict | None:
        try:
            return json.loads((self.state / "server.json").read_text())
        except OSError:
            return None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def kill(self) -> None:
        """Stop whatever server this state directory started, whatever state the test left it in."""
        with contextlib.suppress(Exception):
            self.cli("server", "stop", timeout=60)
        record = self.record()
        if record:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(record["pid"]), signal.SIGKILL)


def flow_runs(api_url: str) -> int:
    request = urllib.request.Request(
        f"{api_url}/flow_runs/count", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(json.loads(resp.read()))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes() != b""


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    loc = Local(tmp_path)
    try:
        yield loc
    finally:
        loc.kill()


def clean_output(done: subprocess.CompletedProcess[str]) -> None:
    """Nothing of Prefect's temporary server or its telemetry in a run's output."""
    text = done.stdout + done.stderr
    assert "ephemeral" not in text.lower() and "telemetry" not in text.lower(), text
    assert "Traceback" not in text, text


@pytest.mark.concurrency
def test_first_run_starts_the_server_the_next_reuses_it_and_the_commands_manage_it(local: Local) -> None:
    """One server boot for the whole life cycle: the boot is the slow part (~20 s on a 2-core machine, ~5 s of it
    when its database starts migrated)."""
    done = local.cli("server", "status")
    assert done.returncode == 1 and "stopped" in done.stdout

    # a stale record (its process is gone) must not stop the first run from starting a server
    local.state.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (local.state / "server.json").write_text(json.dumps({"pid": gone.pid, "port": local.port, "started_at": "x"}))
    # the server's database (prefect.db in its PREFECT_HOME, state/prefect) starts as a copy of a migrated one,
    # as the test servers' do (tests/prefect_server.py): the boot skips ~15 s of migrations, still starts a server
    database = local.state / "prefect" / "prefect.db"
    seed_database(database)

    first = local.cli("demo", "--output", str(local.root / "out"))
    assert first.returncode == 0, first.stdout + first.stderr
    clean_output(first)
    assert "starting the local Prefect server" in first.stderr and f"http://127.0.0.1:{local.port}" in first.stderr
    record = local.record()
    assert record is not None and record["pid"] != gone.pid and record["port"] == local.port and alive(record["pid"])
    with urllib.request.urlopen(f"{local.api_url}/health", timeout=10) as resp:
        assert json.loads(resp.read()) is True
    assert (local.state / "prefect").is_dir() and (local.state / "server.log").exists()
    assert "telemetry" not in (local.state / "server.log").read_text().lower()

    dataset = str(local.root / "out-demo-data" / "sample.parquet")  # where demo writes its dataset
    second = local.cli("run", dataset, "--output", str(local.root / "out2"), "--on-missing", "skip")
    assert second.returncode == 0, second.stdout + second.stderr
    clean_output(second)
    assert "starting the local Prefect server" not in second.stderr
    assert local.record() == record and alive(record["pid"])  # the same server, not a second one
    assert flow_runs(local.api_url) == 2  # both runs are recorded in it
    with contextlib.closing(sqlite3.connect(database)) as db:  # ... in the database under the state directory
        assert db.execute("SELECT count(*) FROM flow_run").fetchone() == (2,)

    done = local.cli("server", "status")
    assert done.returncode == 0 and "running" in done.stdout and f"pid {record['pid']}" in done.stdout
    assert f"UI http://127.0.0.1:{local.port}" in done.stdout
    done = local.cli("server", "start")
    assert done.returncode == 0 and "already running" in done.stdout and f"pid {record['pid']}" in done.stdout

    # PREFECT_API_URL set: a run uses it as is and starts nothing in its own (empty) state directory
    other = Local(local.root / "other")
    demo = other.cli("demo", "--output", str(other.root / "out"), PREFECT_API_URL=local.api_url)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    clean_output(demo)
    assert other.record() is None and not (other.state / "server.log").exists()
    assert "starting the local Prefect server" not in demo.stderr
    assert flow_runs(local.api_url) == 3  # the demo's flow run is in the server it was pointed at

    done = local.cli("server", "stop")
    assert done.returncode == 0 and f"pid {record['pid']}" in done.stdout
    assert not alive(record["pid"]) and local.record() is None
    done = local.cli("server", "status")
    assert done.returncode == 1 and "stopped" in done.stdout
    assert local.cli("server", "stop").stdout.strip() == "local Prefect server: not running"


@pytest.mark.concurrency
def test_a_taken_port_is_a_clear_error(local: Local) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", local.port))
        holder.listen()
        done = local.cli("server", "start", timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"port {local.port} on 127.0.0.1 is in use" in done.stderr
        assert "RECALL_BENCH_SERVER_PORT" in done.stderr and "Traceback" not in done.stderr
        run = local.cli("demo", "--output", str(local.root / "o"))  # a run that needs the server: same error
        assert run.returncode == 2 and f"port {local.port} on 127.0.0.1 is in use" in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    assert local.record() is None


@pytest.mark.concurrency
def test_the_ui_of_the_local_server_talks_to_its_own_api(local: Local) -> None:
    """The printed UI address works in a browser: its ``/ui-settings`` names this server's API (not Prefect's
    default port 4200), and the API at that URL lists the run's flow run."""
    seed_database(local.state / "prefect" / "prefect.db")
    # a UI API URL in the caller's environment (a client-side setting) must not reach our server either
    done = local.cli("server", "start", PREFECT_UI_API_URL="http://127.0.0.1:4200/api")
    assert done.returncode == 0, done.stdout + done.stderr
    ui = f"http://127.0.0.1:{local.port}"
    assert f"UI {ui}" in done.stdout, done.stdout
    with urllib.request.urlopen(f"{ui}/ui-settings", timeout=10) as resp:
        api_url = json.loads(resp.read())["api_url"]
    assert api_url == local.api_url

    run = local.cli("demo", "--output", str(local.root / "out"))
    assert run.returncode == 0, run.stdout + run.stderr
    request = urllib.request.Request(
        f"{api_url}/flow_runs/filter", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        runs = json.loads(resp.read())
    assert len(runs) == 1 and runs[0]["state_type"] == "COMPLETED", runs
