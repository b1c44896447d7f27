"""``run gold.parquet --task-runner dask --dask-address tcp://…`` from the user's folder, against a real Dask
scheduler and worker started in another folder (``recall_tasks/pipeline/dask_paths.py``).

Before: the relative paths reached the workers as they were and the worker looked for ``gold.parquet`` in its own
folder (``error: dataset not found`` once the flow had started). Now they are absolute before anything is shipped;
a worker that does not share the filesystem (here: a worker in its own mount namespace, a tmpfs over the user's
folder) refuses the run in one ``error:`` line naming the cluster, before any judge call.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.pipeline.dask_paths import absolute
from tests import judge_script
from tests.test_caching import cli_env, write
from tests.test_pipeline import KEY, make_rows

ROWS = 24
DASK = str(Path(sys.executable).parent / "dask")


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert proc.poll() is None, (path.parent / "scheduler.log").read_text()
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.1)


def _wait_for_worker(address: str) -> None:
    from distributed import Client

    with Client(address, timeout=60, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=120)


@pytest.fixture
def cluster(tmp_path: Path, judge_env: Any) -> Iterator[Any]:
    """``start(user_folder, shared)``: a scheduler and one worker, both working in a folder that is not the
    user's; ``shared=False`` puts the worker in a mount namespace where the user's folder is an empty tmpfs."""
    procs: list[subprocess.Popen[str]] = []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def start(user: Path, shared: bool = True) -> str:
        env = cli_env(judge_env)
        scheduler_file = elsewhere / "scheduler.json"

        def popen(cmd: list[str]) -> subprocess.Popen[str]:
            with open(elsewhere / f"{cmd[1]}.log", "w") as log:  # a file: a pipe nobody reads would fill up
                proc = subprocess.Popen(cmd, cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
            procs.append(proc)
            return proc

        popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
               "--scheduler-file", str(scheduler_file)])  # fmt: skip
        _wait_for(scheduler_file, procs[0])
        address = json.loads(scheduler_file.read_text())["address"]
        worker = [DASK, "worker", address, "--nworkers", "1", "--nthreads", "4", "--no-dashboard", "--host",
                  "127.0.0.1", "--local-directory", str(elsewhere / "dask-worker")]  # fmt: skip
        if not shared:
            unshare = shutil.which("unshare")
            assert unshare, "unshare (util-linux) is needed for a worker that does not share the filesystem"
            script = f'mount -t tmpfs none "{user}" && exec "$@"'
            worker = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", *worker]
        popen(worker)
        _wait_for_worker(address)
        return str(address)

    yield start
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _run(judge: Any, user: Path, address: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "recall_tasks", "run", "gold.parquet", "--output", "out", "--judge", "openai",
           "--base-url", judge.base_url, "--chunk-size", "8", "--task-runner", "dask",
           "--dask-address", address]  # fmt: skip
    return subprocess.run(cmd, env=cli_env(judge), cwd=user, capture_output=True, text=True, timeout=300)


def test_relative_paths_reach_a_dask_cluster_working_elsewhere_as_absolute_ones(
    prefect_harness, judge_env, tmp_path, cluster
):
    user = tmp_path / "user"
    rows = make_rows(ROWS, seed=3)
    write(user / "gold.parquet", rows)
    address = cluster(user)
    done = _run(judge_env, user, address)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [r for r in DeltaTable(str(user / "out" / "runs")).to_pyarrow_table().to_pylist()]
    assert run["rows"] == ROWS and run["errors"] == 0 and run["requests"] == ROWS
    assert len(judge_env.chat_requests) == ROWS


def test_a_dask_worker_without_the_users_filesystem_refuses_the_run_before_any_judge_call(
    prefect_harness, judge_env, tmp_path, cluster
):
    user = tmp_path / "user"
    write(user / "gold.parquet", make_rows(ROWS, seed=3))
    address = cluster(user, shared=False)
    refused = _run(judge_env, user, address)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = [line for line in (refused.stdout + refused.stderr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, lines
    assert errors[0].startswith(f"error: --dask-address {address}: the Dask cluster's worker tcp://127.0.0.1:")
    assert f"does not see the dataset file {user / 'gold.parquet'} as this machine does" in errors[0], errors[0]
    assert "object storage" in errors[0]
    assert not judge_env.chat_requests and not (user / "out").exists()  # nothing judged, nothing written


def test_only_local_paths_of_a_remote_cluster_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    remote = RunParams(dataset_uri="gold.parquet", output_uri="file://out", canary="labels.jsonl",
                       cache_uri="s3://b/cache", task_runner="dask", dask_address="tcp://h:8786")  # fmt: skip
    fixed = absolute(remote)
    assert fixed.dataset_uri == str(tmp_path / "gold.parquet") and fixed.canary == str(tmp_path / "labels.jsonl")
    assert fixed.output_uri == f"file://{tmp_path / 'out'}" and fixed.cache_uri == "s3://b/cache"
    local = RunParams(dataset_uri="gold.parquet", task_runner="dask")  # a LocalCluster works in this folder
    assert absolute(local) is local
