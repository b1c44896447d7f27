"""docs/deployments.md's laptop recipe, its four bash blocks as written: the local server, a process work pool, the
deployments, a worker, a nightly run started with ``--watch``, then ``emit-index-built`` and what it says to watch
to confirm the run it triggered.

The blocks run in a folder laid out as the repository root (``flows/``, ``deployments/`` and ``.venv`` linked to
this checkout's) with the recipe's ``evals/golden.parquet``; the nightly deployment's openai judge is the fake
OpenAI server (``OPENAI_BASE_URL`` in the worker's environment, as the recipe says), the index run is lexical.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests import judge_script
from tests.prefect_server import REPO, seed_database
from tests.test_pipeline import KEY, make_rows, write_parquet
from tests.test_server import Local

DOC = REPO / "docs" / "deployments.md"
RUN_NAME = "recall-golden.parquet-index-laptop-1"


def recipe() -> list[str]:
    section = DOC.read_text().split("\n## On a laptop: the local server\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 4
    return blocks


def bash(code: str, cwd: Path, env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def first_terminal(code: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` in "the first terminal": the variables its earlier blocks exported, and those it exports kept."""
    state = cwd.parent / "first-terminal.sh"
    restore = f'source "{state}"\n' if state.exists() else ""
    return bash(f'{restore}{code}\nexport -p > "{state}"', cwd, env)


def flow_runs(api: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{api}/flow_runs/filter", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return list(json.loads(resp.read()))


@pytest.mark.concurrency
def test_the_laptop_recipe_runs_as_written(tmp_path: Path, fake_openai: Any) -> None:
    fake_openai.set_responder(judge_script.responder)
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("flows", "deployments", ".venv"):
        (root / name).symlink_to(REPO / name)
    write_parquet(root / "evals" / "golden.parquet", make_rows(12))
    local = Local(tmp_path / "local")
    seed_database(local.state / "prefect" / "prefect.db")
    # the worker asks for scheduled runs every second, not Prefect's default 10: the environment's, not the recipe's
    env = local.env(
        OPENAI_API_KEY=KEY, OPENAI_BASE_URL=fake_openai.base_url, COLUMNS="250", PREFECT_WORKER_QUERY_SECONDS="1"
    )
    api = f"http://127.0.0.1:{local.port}/api"
    server, worker_block, run_block, confirm_block = recipe()
    worker: subprocess.Popen[str] | None = None
    log = (tmp_path / "worker.log").open("w")
    try:
        done = first_terminal(server, root, env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"http://127.0.0.1:{local.port}" in done.stdout + done.stderr

        worker = subprocess.Popen(
            ["bash", "-c", worker_block], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip

        done = first_terminal(run_block, root, env)
        assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "worker.log").read_text()
        assert "Completed" in done.stdout, done.stdout
        said = done.stderr
        assert re.search(r"^[0-9a-f-]{36}$", done.stdout, re.M), done.stdout  # the event id, alone on its line
        assert "sent search.index.built (event " in said and f"to {api}" in said, said
        assert "which the 1 worker(s) of recall-pool online pick up within seconds" in said, said
        assert "prefect flow-run ls --flow-name recall-benchmark --state-type RUNNING" in said and RUN_NAME in said, (
            said
        )
        assert f"http://127.0.0.1:{local.port}/runs" in said and "label index-laptop-1" in said, said

        deadline = time.monotonic() + 300  # the triggered run: Scheduled by the automation, run by the worker
        while not any(r["name"] == RUN_NAME and r["state_type"] == "COMPLETED" for r in flow_runs(api)):
            assert time.monotonic() < deadline, (flow_runs(api), (tmp_path / "worker.log").read_text())
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=1)
            assert worker.returncode is None, (tmp_path / "worker.log").read_text()

        done = first_terminal(confirm_block, root, env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(rf"{re.escape(RUN_NAME)}\s.*COMPLETED", done.stdout), done.stdout
        history = done.stdout.split("┃ started", 1)[1]
        assert re.search(r"│ golden\s+│ index-laptop-1\s+│ \S+\s+│ completed\s+│ lexical", history), history
        assert re.search(r"│ golden\s+│ nightly\s+│ \S+\s+│ completed\s+│ gpt-4o-mini", history), history
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGINT)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
        local.kill()
        log.close()
