"""The collector's thresholds and the environment: the ``recall-bench`` process sets its own
(``cli.app.settle_process``, from ``console_main``); the library (``import recall_tasks``, ``evaluate()``) sets
nothing in its host (``tests/test_evaluate.py`` runs ``evaluate()`` under a host's own thresholds)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_pipeline import expected, make_rows, write_parquet

MINE = (701, 11, 12)  # a process's own thresholds, distinct from the defaults and from the CLI's
RAISED = (20_000, 11, 100)  # MINE in the CLI's process: each at least CLI_GC_THRESHOLDS' value
SETTINGS = ("_RJEM_MALLOC_CONF", "TOKIO_WORKER_THREADS")


@pytest.fixture
def own_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(*MINE)
    try:
        yield
    finally:
        gc.set_threshold(*before)


#: Imports the library and what a run imports, and says whether the host's environment or thresholds changed.
IMPORT_PROBE = """
import gc, json, os
gc.set_threshold(701, 11, 12)
env = dict(os.environ)
import recall_tasks
recall_tasks.evaluate, recall_tasks.OpenAIJudge  # the lazy public names, resolved
import recall_tasks.pipeline.conduct, recall_tasks.pipeline.flow, recall_tasks.io.delta, deltalake
changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))
print(json.dumps({"changed": changed, "thresholds": gc.get_threshold()}))
"""


@pytest.mark.concurrency  # a subprocess
def test_importing_the_library_sets_nothing_in_its_host() -> None:
    """Before, ``import recall_tasks`` set ``TOKIO_WORKER_THREADS`` and ``_RJEM_MALLOC_CONF`` for the process."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"changed": [], "thresholds": list(MINE)}


def test_the_cli_process_raises_each_threshold_and_keeps_a_users_own(
    own_thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recall_tasks.cli.app import settle_process

    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    settle_process()
    assert gc.get_threshold() == RAISED
    assert os.environ["TOKIO_WORKER_THREADS"] == "1"
    assert os.environ["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:0,muzzy_decay_ms:0"
    monkeypatch.setenv("TOKIO_WORKER_THREADS", "3")
    gc.set_threshold(50_000, 5, 1_000)
    settle_process()
    assert gc.get_threshold() == (50_000, 10, 1_000) and os.environ["TOKIO_WORKER_THREADS"] == "3"
    gc.set_threshold(0, 10, 10)  # collection switched off by its owner stays off
    settle_process()
    assert gc.get_threshold() == (0, 10, 10)


@pytest.mark.parametrize("extra", [["--dry-run"], ["--threshold", "-1"]])
def test_a_run_command_that_stops_before_judging_leaves_the_collector_on(extra: list[str], tmp_path: Path) -> None:
    """Called in process (CliRunner, a notebook), a dry run or a refused option gives the process back with its
    collector on (``run`` once paused it while it started)."""
    from typer.testing import CliRunner

    from recall_tasks.cli import app as cli

    data = write_parquet(tmp_path / "eval.parquet", make_rows(3))
    assert gc.isenabled()
    done = CliRunner().invoke(cli.app, ["run", data, "-o", str(tmp_path / "out"), *extra])
    assert done.exit_code == (0 if extra == ["--dry-run"] else 2), done.output
    assert gc.isenabled()


#: ``recall-bench`` after ``import recall_tasks``: what the import left of the process's settings, and at the exit
#: what the command set, how many full collections it made and how many objects the exit froze.
CLI_WATCH = """
import atexit, gc, json, os, sys
import recall_tasks
imported = {"env": {k: os.environ.get(k) for k in ("_RJEM_MALLOC_CONF", "TOKIO_WORKER_THREADS")},
            "thresholds": gc.get_threshold()}
full = []
def report():
    exiting = {"env": {k: os.environ.get(k) for k in ("_RJEM_MALLOC_CONF", "TOKIO_WORKER_THREADS")},
               "thresholds": gc.get_threshold(), "full": len(full), "frozen": gc.get_freeze_count()}
    print("SETTINGS " + json.dumps({"imported": imported, "exiting": exiting}), flush=True)
atexit.register(report)
from recall_tasks.cli.app import console_main  # the entry point's module: imported before console_main runs
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
sys.argv = ["recall-bench"] + sys.argv[1:]
console_main()
"""


@pytest.mark.concurrency  # a real CLI process on the test's Prefect server
def test_the_cli_sets_its_own_settings_and_a_run_of_thousands_of_rows_makes_no_full_collection(
    prefect_harness: None, fake_openai: Any, tmp_path: Path
) -> None:
    """``recall-bench run`` sets what its process needs in ``console_main``, not at ``import recall_tasks``, and its
    figures are the run's: 3,000 rows scored as expected, no full collection while it ran; its exit freezes the
    heap before the interpreter's finalization."""
    from deltalake import DeltaTable

    from tests import judge_script
    from tests.test_caching import ROOT, cli_env

    fake_openai.set_responder(judge_script.responder)
    rows = make_rows(3000, seed=43)
    data = write_parquet(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    env = {k: v for k, v in cli_env(fake_openai).items() if k not in SETTINGS}
    cmd = [sys.executable, "-c", CLI_WATCH, "run", data, "--output", str(out), "--chunk-size", "500",
           "--judge", "openai", "--base-url", fake_openai.base_url]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("SETTINGS ")]
    got = json.loads(line.removeprefix("SETTINGS "))
    assert got["imported"] == {"env": dict.fromkeys(SETTINGS), "thresholds": [700, 10, 10]}
    assert got["exiting"]["env"] == {"_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0",
                                     "TOKIO_WORKER_THREADS": "1"}  # fmt: skip
    assert got["exiting"]["thresholds"] == [20_000, 10, 100] and got["exiting"]["full"] == 0
    assert got["exiting"]["frozen"] > 100_000  # the exit froze the heap: the finalization's collections skip it
    results = DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()
    by_id = {r["row_id"]: r["score"] for r in results}
    assert len(results) == 3000 and all(by_id[r["row_id"]] == pytest.approx(expected(r)) for r in rows)
