"""What keeps an ad-hoc run's start-up short, checked structurally (speed itself is in benchmarks/startup.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prefect import Flow

from recall_tasks.config import RunParams
from recall_tasks.pipeline.flow import recall_benchmark
from tests.prefect_server import REPO, clean_env


@pytest.mark.concurrency
def test_cli_and_server_commands_import_neither_prefect_nor_openai_nor_numpy():
    code = (
        "import sys, recall_tasks.cli.app, recall_tasks.cli.server, recall_tasks\n"
        "heavy = ('prefect', 'openai', 'fastapi', 'duckdb', 'deltalake', 'numpy', 'pyiceberg')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "recall_tasks.LexicalJudge\n"
        "assert 'openai' not in sys.modules\n"
        "recall_tasks.OpenAIJudge\n"
        "assert 'openai' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(REPO)), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


def test_flow_parameters_are_serialised_as_prefect_would_without_fastapi():
    params = RunParams(
        dataset_uri="s3://bucket/eval.parquet", segment_by=["category"], columns={"input": "question"},
        storage_options={"endpoint_url": "http://localhost:8333"}, max_cost_usd=1.5, baseline=None,
    )  # fmt: skip
    ours = recall_benchmark.serialize_parameters({"params": params})
    assert ours == Flow.serialize_parameters(recall_benchmark, {"params": params})
    assert ours["params"]["storage_options"] == {"endpoint_url": "http://localhost:8333"}
    as_dict = {"params": {"dataset_uri": "x.parquet", "label": None}}  # a deployment's parameters
    assert recall_benchmark.serialize_parameters(as_dict) == as_dict


@pytest.mark.concurrency
def test_the_head_start_judges_before_prefect_starts_and_a_prefect_failure_keeps_its_rows(
    prefect_harness, fake_openai, tmp_path
):
    """The first chunks are judged before Prefect is even imported: with a dead API URL that only Prefect itself
    can read (a profile, checked after its import), the run fails in one line AFTER the head start judged its
    window of chunks (--max-workers 4 of the 5); nothing is committed, the rows are in the row cache, and the
    rerun against a live server judges only the other rows. Then each row was judged exactly once."""
    from deltalake import DeltaTable

    from tests import judge_script
    from tests.prefect_server import free_port
    from tests.test_caching import ROOT, cli_env, write
    from tests.test_pipeline import expected, make_rows

    fake_openai.set_responder(judge_script.responder)
    rows = make_rows(100, seed=5)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    dead = f"http://127.0.0.1:{free_port()}/api"
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(f'active = "dead"\n\n[profiles.dead]\nPREFECT_API_URL = "{dead}"\n')
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", fake_openai.base_url, "--chunk-size", "20", "--max-concurrency", "8"]  # fmt: skip
    env = cli_env(fake_openai, PREFECT_PROFILES_PATH=str(profiles))
    env.pop("PREFECT_API_URL")
    first = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 2, first.stdout + first.stderr
    assert f"error: the Prefect API at {dead} (PREFECT_API_URL) cannot be reached" in first.stderr
    judged = len(fake_openai.chat_requests)
    assert judged == 80, first.stderr  # the head start's 4 chunks, judged while Prefect was imported
    assert not (out / "results").exists() and not (out / "runs").exists()

    rerun = subprocess.run(cmd, env=cli_env(fake_openai), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert len(fake_openai.chat_requests) == len(rows)  # the other 20 rows only: every row judged once
    (run,) = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    # the 80 rows the failed attempt paid for are the run's spend, not cache hits: every request is counted once
    assert run["rows"] == 100 and run["errors"] == 0 and run["cached"] == 0 and run["requests"] == 100
    results = DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()
    by_id = {r["row_id"]: r for r in results}
    assert all(by_id[r["row_id"]]["score"] == pytest.approx(expected(r)) for r in rows)


@pytest.mark.concurrency
def test_head_start_responses_arriving_while_prefect_imports_are_parsed(prefect_harness, fake_openai, tmp_path):
    """Judge replies land while the main thread imports Prefect (100 ms latency, one 300-row chunk at concurrency
    32: ~300 replies a second for ~1 s, overlapping the import). Before httpx was imported ahead of the head
    start, the openai SDK met a half-imported httpx on a reply in 5 runs of 6 (``partially initialized module``)."""
    from deltalake import DeltaTable

    from tests import judge_script
    from tests.test_caching import ROOT, cli_env, write
    from tests.test_pipeline import expected, make_rows

    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.1
    rows = make_rows(300, seed=9)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", fake_openai.base_url, "--chunk-size", "300", "--max-concurrency", "32"]  # fmt: skip
    done = subprocess.run(cmd, env=cli_env(fake_openai), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(fake_openai.chat_requests) == len(rows)  # the head start's chunk was not judged a second time
    results = DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()
    assert len(results) == 300 and all(r["error"] is None for r in results)
    by_id = {r["row_id"]: r for r in results}
    assert all(by_id[r["row_id"]]["score"] == pytest.approx(expected(r)) for r in rows)


#: ``recall-bench`` with a watch on the collector: the collections made inside the ``run`` command before the
#: run froze its start-up, and any collection after the exit handlers ran (the interpreter's finalization).
GC_WATCH = """
import atexit, gc, json, os, sys
unfrozen, exiting = [], []
def inside_run_command():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "run" and frame.f_code.co_filename.endswith("app.py"):
            return True
        frame = frame.f_back
    return False
def watch(phase, info):
    if phase == "start" and exiting:
        os.write(1, b"COLLECTED AT SHUTDOWN\\n")
    elif phase == "start" and gc.get_freeze_count() == 0 and inside_run_command():
        unfrozen.append(info["generation"])
gc.callbacks.append(watch)
def last():
    print("GC " + json.dumps({"unfrozen": unfrozen}), flush=True)
    exiting.append(True)
atexit.register(last)
from recall_tasks.cli.app import console_main
sys.argv = ["recall-bench"] + sys.argv[1:]
console_main()
"""


@pytest.mark.concurrency
def test_a_run_collects_no_garbage_before_prefect_is_imported_and_skips_the_shutdown(prefect_harness, tmp_path):
    """Start-up's objects live as long as the process: no collection walks them while ``recall-bench run``
    starts (from its first line: reading its options and importing pyarrow, the pre-flight, the plan and the
    head start, far more than one young generation's 700 allocations; Typer's parsing before it may collect),
    then ``gc.freeze`` takes them out of every later collection. The exit runs the exit handlers and skips the
    interpreter's finalization (``runtime.exit_process``), whose last collection walked the whole heap (~1.5 s
    after a 1,000-row run) and where Arrow's threads could abort the process."""
    import json

    from tests.test_caching import ROOT, cli_env, write
    from tests.test_pipeline import make_rows

    data = write(tmp_path / "eval.parquet", make_rows(30, seed=3))
    cmd = [sys.executable, "-c", GC_WATCH, "run", data, "--output", str(tmp_path / "out"), "--chunk-size", "10"]
    done = subprocess.run(cmd, env=cli_env(None), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("GC "), done.stdout  # the exit handlers ran, and nothing collected after them
    assert json.loads(last.removeprefix("GC "))["unfrozen"] == []


@pytest.mark.parametrize("local", [True, False], ids=["local-server", "configured-url"])
def test_runs_on_the_local_server_send_no_flow_heartbeats_a_configured_api_keeps_them(monkeypatch, local):
    """The engine joins the heartbeat thread at the end of every flow run while it sleeps in 1 s steps; on
    recall-bench's own server nothing reads heartbeats, on a configured one a zombie-flow automation may."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from recall_tasks.cli import runtime, server

    url = "http://127.0.0.1:9/api"
    monkeypatch.setattr(server, "api_url_for_run", lambda on_boot=None: (url, local))
    monkeypatch.setattr(runtime, "_check_reachable", lambda url: None)
    # Prefect's default, a heartbeat every 180 s (the session's prefect_harness turns them off for its own runs)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 180}):
        with runtime._prefect_api():
            inside = PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value()
            if local:
                assert PREFECT_API_URL.value() == url
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 180
    assert inside == (None if local else 180)
