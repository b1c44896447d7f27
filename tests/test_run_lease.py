"""The same ``recall-bench run`` started twice (a cron job and a manual rerun): real CLI processes, the fake judge
holding its answers until the test lets them go, outputs on a local folder and on SeaweedFS.

Before the lease, the second process "resumed" the live run: every row judged twice (192 requests for 96 rows)
and ``runs.requests`` 96. Now it is refused in one line, or waits with ``--wait-for-lock``; a killed attempt's
run is taken over at once by the same command on the same machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from recall_tasks.io.storage import StorageConfig, filesystem
from tests import judge_script
from tests import s3_server as _s3
from tests.test_caching import ROOT, cli_env, write
from tests.test_pipeline import KEY, make_rows

s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket

ROWS = 96


@pytest.fixture
def gate(fake_openai, monkeypatch):
    """The fake judge answers only once the gate is open (it holds the first attempt in mid-judging)."""
    opened = threading.Event()

    def held(body: dict[str, Any]) -> str:
        assert opened.wait(120), "the gate was never opened"
        return judge_script.responder(body)

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(held)
    yield opened
    opened.set()


@pytest.fixture(params=["local", "s3"])
def output(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The run's output and the extra environment it needs, on each backend."""
    if request.param == "local":
        return str(tmp_path / "out"), {}
    server: _s3.S3Server = request.getfixturevalue("s3_server")
    return f"s3://{request.getfixturevalue('s3_bucket')}/out", server.env()


def judging(judge: Any, timeout: float = 120) -> bool:
    """Wait for the first judge request (the pre-flight's ``GET /models`` comes before the lease is taken)."""
    deadline = time.monotonic() + timeout
    while not judge.chat_requests:
        if time.monotonic() > deadline:
            return False
        judge.wait_for_requests(len(judge.requests) + 1, timeout=1)
    return True


def command(judge: Any, data: str, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "recall_tasks", "run", data, "--output", out, "--judge", "openai",
            "--base-url", judge.base_url, "--chunk-size", "12", "--max-concurrency", "8", *extra]  # fmt: skip


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap():
    """A process a failed test left running is killed and waited for."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def start(judge: Any, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        cmd, env=cli_env(judge, **env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _started.append(proc)
    return proc


def runs_of(out: str, env: dict[str, str]) -> list[dict[str, Any]]:
    options = {k: v for k, v in env.items() if k.startswith("AWS_")}
    storage = StorageConfig.from_options({k.lower(): v for k, v in options.items()})
    fs, root = filesystem(out, storage)
    if not fs.exists(f"{root}/runs"):
        return []
    from recall_tasks.io.storage import delta_storage_options

    table: pa.Table = DeltaTable(out + "/runs", storage_options=delta_storage_options(out, storage)).to_pyarrow_table()
    return [r for r in table.to_pylist() if r["segment_column"] is None]


def pending_run_id(out: str, env: dict[str, str]) -> str:
    storage = StorageConfig.from_options({k.lower(): v for k, v in env.items() if k.startswith("AWS_")})
    fs, root = filesystem(out, storage)
    (path,) = [p for p in fs.ls(f"{root}/_pending") if str(p).endswith(".json")]
    return str(json.loads(fs.cat_file(path))["run_id"])


@pytest.mark.concurrency
def test_the_same_command_twice_the_second_is_refused_in_one_line_and_nothing_is_paid_twice(
    prefect_harness, fake_openai, gate, tmp_path, output
):
    out, env = output
    data = write(tmp_path / "eval.parquet", make_rows(ROWS, seed=5))
    cmd = command(fake_openai, data, out)
    first = start(fake_openai, cmd, env)
    try:
        assert judging(fake_openai), first.communicate()  # judging, answers held
        second = subprocess.run(cmd, env=cli_env(fake_openai, **env), cwd=ROOT, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
    finally:
        gate.set()
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr

    assert second.returncode == 2, second.stdout + second.stderr
    lines = [line for line in (second.stdout + second.stderr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in second.stderr, lines
    (run,) = runs_of(out, env)
    assert errors[0].startswith(f"error: run in progress: run {run['run_id']} of this command is being judged since ")
    assert f"by host {socket.gethostname()}, process {first.pid} (lease renewed " in errors[0]
    assert "--wait-for-lock" in errors[0] and KEY not in second.stdout + second.stderr
    # every row judged once, by the first attempt: before, 192 requests were paid and runs.requests said 96
    assert len(fake_openai.chat_requests) == ROWS
    assert run["requests"] == ROWS and run["rows"] == ROWS


@pytest.mark.concurrency
def test_wait_for_lock_waits_for_the_live_attempt_then_runs_from_the_caches(
    prefect_harness, fake_openai, gate, tmp_path
):
    out = str(tmp_path / "out")
    data = write(tmp_path / "eval.parquet", make_rows(ROWS, seed=6))
    cmd = command(fake_openai, data, out)
    first = start(fake_openai, cmd, {})
    try:
        assert judging(fake_openai), first.communicate()
        second = start(fake_openai, [*cmd, "--wait-for-lock"], {})
        assert second.stderr is not None
        before = []  # the judge line, then the waiting line: read before the gate opens
        while not (line := second.stderr.readline()).startswith("waiting:") and line:
            before.append(line)
        waiting = line
        assert waiting.startswith("waiting: run in progress: run "), before
        assert f"process {first.pid} " in waiting and "--wait-for-lock" not in waiting, waiting
    finally:
        gate.set()
    assert first.wait(timeout=300) == 0, first.communicate()
    stdout, stderr = second.communicate(timeout=300)
    assert second.returncode == 0, stdout + stderr
    runs = runs_of(out, {})
    assert len(runs) == 2 and sorted(r["requests"] for r in runs) == [0, ROWS]  # the second: all from the caches
    assert len(fake_openai.chat_requests) == ROWS


@pytest.mark.concurrency
def test_a_killed_attempt_is_taken_over_at_once_by_the_same_command(prefect_harness, fake_openai, gate, tmp_path):
    out = str(tmp_path / "out")
    data = write(tmp_path / "eval.parquet", make_rows(ROWS, seed=7))
    cmd = command(fake_openai, data, out)
    first = start(fake_openai, cmd, {"RECALL_BENCH_LEASE_S": "3600"})  # its lease would hold an hour
    try:
        assert judging(fake_openai), first.communicate()
        killed_run = pending_run_id(out, {})
        os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
    finally:
        gate.set()
    rerun = subprocess.run(cmd, env=cli_env(fake_openai), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    (run,) = runs_of(out, {})
    assert run["run_id"] == killed_run and run["rows"] == ROWS  # the killed attempt's run, resumed
