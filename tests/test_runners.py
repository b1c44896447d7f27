"""``--task-runner processes|dask``: chunks scored in worker processes from a picklable spec, real components.

Prefect's test server, the fake OpenAI server (in this process, reached over HTTP by the workers), a process
pool or a Dask LocalCluster of two workers. The tables must equal a threads run's, the chunks must have run in
at least two processes, and an unchanged rerun must be served from the caches.
"""

from __future__ import annotations

import os
import pickle
import time

import pytest
from deltalake import DeltaTable
from pydantic import ValidationError

from recall_tasks.config import RunParams
from recall_tasks.io.blocks import iter_blocks, read_block
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline import workers
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.test_pipeline import KEY, make_rows, write_parquet

ROWS = 60


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def table(out) -> dict[str, tuple]:
    t = DeltaTable(str(out / "results")).to_pyarrow_table()
    cols = [t.column(c).to_pylist() for c in ("row_id", "score", "success", "verdicts", "error")]
    return {row[0]: tuple(row[1:]) for row in zip(*cols, strict=True)}


@pytest.fixture
def record_pids(monkeypatch):
    """Record the pid of every chunk report the flow settles (the flow's side of the real runner)."""
    from recall_tasks.pipeline import flow

    seen: list[tuple[str, int | None]] = []
    original = workers.adopt

    def adopt(plan, report):
        seen.append((plan.run_id, report.pid))
        original(plan, report)

    monkeypatch.setattr(flow.workers, "adopt", adopt)
    return seen


def run(data: str, out, base_url: str, **kw) -> dict:
    return recall_benchmark(
        RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=base_url, chunk_size=6, **kw)
    )


@pytest.fixture(scope="module")
def threads_run(prefect_harness, fake_openai_server, tmp_path_factory) -> tuple[str, dict[str, tuple], int]:
    """The dataset both worker runners are compared on, and its threads run (once for both): its table and the
    judge requests it made."""
    tmp = tmp_path_factory.mktemp("threads-run")
    rows = [{k: v for k, v in r.items() if k != "row_id"} for r in make_rows(ROWS - 5, seed=13)]
    rows += rows[10:15]  # exact duplicates, ids ``<hash>~2``: they must survive the workers' re-reads
    data = write_parquet(tmp / "data" / "eval.parquet", rows, row_group_size=20)
    fake_openai_server.reset()
    fake_openai_server.set_responder(judge_script.responder)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", KEY)
        threads = run(data, tmp / "threads", fake_openai_server.base_url)
    assert threads["scored"] == ROWS
    return data, table(tmp / "threads"), len(fake_openai_server.chat_requests)


@pytest.mark.parametrize("runner", ["processes", "dask"])
@pytest.mark.concurrency
def test_worker_runs_equal_a_threads_run_in_two_processes_and_rerun_from_cache(
    threads_run, judge_env, record_pids, tmp_path, runner
):
    data, threads_table, judged = threads_run  # judge_env is the fake server reset after the threads run
    out = tmp_path / runner
    first = run(data, out, judge_env.base_url, task_runner=runner, workers=2)
    assert first["scored"] == ROWS and first["errors"] == 0 and first["status"] == "completed"
    # every distinct row judged once, in the workers: a duplicate row lands in its original's chunk
    assert len(judge_env.chat_requests) == judged == ROWS - 5
    assert table(out) == threads_table
    assert sum("~2" in row_id for row_id in table(out)) == 5
    pids = {pid for run_id, pid in record_pids if run_id == first["run_id"]}
    assert len(pids) >= 2 and os.getpid() not in pids

    requests = len(judge_env.chat_requests)
    again = run(data, out, judge_env.base_url, task_runner=runner, workers=2)
    assert again["rows"] == ROWS and again["run_id"] != first["run_id"]
    assert len(judge_env.chat_requests) == requests and again["requests"] == 0  # the row cache served every row
    assert again["scored"] == first["scored"] and table(out) == threads_table


def test_duplicate_rows_get_their_ids_back_when_a_worker_rereads_a_block(tmp_path):
    rows = make_rows(10, seed=2)
    rows = [{k: v for k, v in r.items() if k != "row_id"} for r in rows]
    rows = rows + rows[:4] + rows[:2]  # ``~2`` and ``~3`` ids, across row groups and blocks
    data = write_parquet(tmp_path / "eval.parquet", rows, row_group_size=5)
    ds = open_dataset(data, StorageConfig.from_options())
    for block in iter_blocks(ds, 3):
        seen = {}
        for rid in block.row_ids:
            base, _, n = rid.partition("~")
            if n and base not in seen:
                seen[base] = int(n) - 1
        again = read_block(ds, block.source, block.first_row, len(block.row_ids), seen)
        assert again.row_ids == block.row_ids and again.content_hashes == block.content_hashes
        assert again.table.equals(block.table)


def test_the_spec_pickles_and_holds_no_rows(tmp_path):
    from recall_tasks.pipeline import steps

    data = write_parquet(tmp_path / "eval.parquet", make_rows(30), row_group_size=10)
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), chunk_size=7, task_runner="processes")
    plan = steps.plan_run(params)
    try:
        block = next(iter_blocks(plan.dataset, 7))
        spec = workers.chunk_spec(plan, 0, block, steps.chunk_key(plan, block))
        blob = pickle.dumps(spec)
        assert len(blob) < 4000 and b"What about item" not in blob
        report = workers.score_spec(pickle.loads(blob))
        assert report.rows == 7 and report.pid == os.getpid() and plan.store.exists(report.path)
        assert report.path == plan.store.chunk_path(spec.key, plan.run_id)
    finally:
        steps.release(plan)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"task_runner": "processes", "retriever": "m:f"}, "--retriever runs in the flow's process"),
        ({"task_runner": "processes", "batch": True}, "--batch runs with --task-runner threads only"),
        ({"workers": 2}, "--workers applies to --task-runner processes or dask"),
        ({"task_runner": "processes", "dask_address": "tcp://x:8786"}, "--dask-address needs --task-runner dask"),
    ],
)
def test_options_a_runner_cannot_honour_are_refused(kw, message):
    with pytest.raises(ValidationError, match=message):
        RunParams(dataset_uri="d.parquet", **kw)


@pytest.mark.concurrency
def test_processes_on_object_storage_share_the_row_cache_next_to_the_results(
    prefect_harness, judge_env, s3_server, s3_bucket, monkeypatch, record_pids, tmp_path
):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    rows = make_rows(24, seed=4)
    local = write_parquet(tmp_path / "eval.parquet", rows, row_group_size=10)
    s3_server.client().upload_file(local, s3_bucket, "datasets/eval.parquet")
    data, out = f"s3://{s3_bucket}/datasets/eval.parquet", f"s3://{s3_bucket}/out"
    params = RunParams(dataset_uri=data, output_uri=out, judge="openai", base_url=judge_env.base_url, chunk_size=6,
                       task_runner="processes", workers=2)  # fmt: skip
    first = recall_benchmark(params)
    assert first["scored"] == 24 and len(judge_env.chat_requests) == 24
    assert len({pid for run_id, pid in record_pids if run_id == first["run_id"]}) >= 2
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.startswith("out/cache/") for k in keys)  # the workers' verdicts, next to the results
    assert not any("_prefect-cache" in k for k in keys)  # no Prefect result record anywhere
    again = recall_benchmark(params)
    assert again["rows"] == 24 and len(judge_env.chat_requests) == 24 and again["requests"] == 0
    assert again["cached"] == 24 and again["scored"] == 24


@pytest.mark.concurrency
def test_a_worker_process_tripped_breaker_fails_the_run_with_its_reason(prefect_harness, judge_env, tmp_path):
    from recall_tasks.errors import RunFailed
    from tests.fake_openai import Status

    data = write_parquet(tmp_path / "eval.parquet", make_rows(40, seed=63))
    judge_env.enqueue(*[Status(503)] * 200)
    with pytest.raises(RunFailed) as info:
        run(data, tmp_path / "out", judge_env.base_url, task_runner="processes", workers=2, max_retries=0,
            max_concurrency=2)  # fmt: skip
    summary = info.value.summary
    assert summary["status"] == "failed" and summary["scored"] == 0
    assert "failed 10 attempts in a row (last: HTTP 503)" in summary["status_reason"]  # the worker's, not the rate
    assert summary["not_judged"] > 0 and summary["skipped"] == 0  # rows the worker's breaker kept from the judge


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--task-runner", "processes", "--workers", "3"], {"task_runner": "processes", "workers": 3}),
        (["--task-runner", "dask", "--dask-address", "tcp://s:8786"], {"task_runner": "dask", "workers": None}),
        ([], {"task_runner": "threads", "workers": None, "dask_address": None}),
    ],
)
def test_run_options_reach_the_parameters(monkeypatch, tmp_path, argv, expected):
    from typer.testing import CliRunner

    from recall_tasks.cli import app as cli
    from recall_tasks.cli import run_flow

    seen: list[RunParams] = []

    def fake_run(params: RunParams, debug: bool) -> dict:
        seen.append(params)
        raise SystemExit(0)

    monkeypatch.setattr(run_flow, "_run", fake_run)
    result = CliRunner().invoke(cli.app, ["run", str(tmp_path / "d.parquet"), "-o", str(tmp_path / "o"), *argv])
    assert result.exit_code == 0, result.output
    assert {k: getattr(seen[0], k) for k in expected} == expected


def test_budgets_hold_for_the_run_with_every_runner():
    for runner in ("processes", "dask"):  # counted in Prefect for the whole run (fleet/budget.py)
        params = RunParams(dataset_uri="d.parquet", task_runner=runner, max_cost_usd=1.0, max_requests=10)
        assert (params.max_cost_usd, params.max_requests) == (1.0, 10)


def test_max_cost_usd_with_a_model_of_no_known_price_is_refused_unless_given_one():
    """An unpriced call costs None, which no budget can count: refused before the run on every runner, naming
    --price; a --price for the model (or its family's known price) lets it run."""
    from types import SimpleNamespace

    from recall_tasks.errors import ConfigError
    from recall_tasks.judges.pricing import PRICES_PER_MTOK
    from recall_tasks.pipeline.checks import check_priced

    def check(prices=None, **kw):
        judge = SimpleNamespace(prices={**PRICES_PER_MTOK, **(prices or {})})
        check_priced(RunParams(dataset_uri="d.parquet", prices=prices or {}, **kw), judge)

    with pytest.raises(ConfigError, match=r"cannot bound model llama-3-70b: .* --price llama-3-70b=IN,OUT"):
        check(model="llama-3-70b", max_cost_usd=1.0, task_runner="processes")
    with pytest.raises(ConfigError, match="cannot bound model gpt-x"):
        check(units="claims", extractor_model="gpt-x", max_cost_usd=1.0)
    check(model="llama-3-70b", max_cost_usd=1.0, prices={"llama-3-70b": (0.0, 0.0)})  # priced by hand: runs
    check(model="gpt-4o-mini-2024-07-18", max_cost_usd=1.0)  # a dated snapshot: its family's price
    check(model="llama-3-70b")  # no cost budget: nothing to refuse
    check_priced(RunParams(dataset_uri="d.parquet", max_cost_usd=1.0), object())  # lexical: costs nothing


def test_a_given_price_reaches_the_judge_and_the_claim_extractor(monkeypatch):
    from recall_tasks.pipeline.components import make_extractor, make_judge

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-prices")
    params = RunParams(
        dataset_uri="d.parquet", judge="openai", model="my-model", units="claims", extractor_model="my-extractor",
        prices=["my-model=1,2", "my-extractor=0.5,0.5"],
    )  # fmt: skip
    judge = make_judge(params)
    extractor = make_extractor(params, judge)
    assert judge.prices["my-model"] == (1.0, 2.0) and extractor.prices["my-extractor"] == (0.5, 0.5)  # type: ignore[attr-defined]
    assert judge.prices["gpt-4o-mini"] == (0.15, 0.60)  # the known prices stay  # type: ignore[attr-defined]


def test_run_refuses_an_option_the_runner_cannot_honour_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    argv = ["run", str(tmp_path / "d.parquet"), "--task-runner", "processes", "--batch"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "--batch runs with --task-runner threads" in lines[0]


@pytest.mark.concurrency
def test_the_cli_runs_processes_equal_to_threads(prefect_harness, judge_env, record_pids, tmp_path):
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = write_parquet(tmp_path / "eval.parquet", make_rows(30, seed=8), row_group_size=10)
    base = ["run", data, "--judge", "openai", "--base-url", judge_env.base_url, "--chunk-size", "5"]
    threads = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "threads")])
    assert threads.exit_code == 0, threads.output
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    ran = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "p"), "--task-runner", "processes", "--workers", "2"])
    assert ran.exit_code == 0, ran.output
    assert len(judge_env.chat_requests) == 30  # each row once
    assert table(tmp_path / "p") == table(tmp_path / "threads")
    assert os.getpid() not in {pid for _, pid in record_pids} and len({pid for _, pid in record_pids}) >= 2


def _children(parent: int) -> list[int]:
    """The live processes multiprocessing spawned from ``parent`` (the pool's workers), from ``/proc``."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                spawned = b"multiprocessing.spawn" in f.read()
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(ppid) == parent and spawned and state != "Z":
            pids.append(int(entry))
    return sorted(pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _alert_event(name: str, run_id: str, timeout: float = 30.0) -> dict:
    """The event ``name`` of run ``run_id`` as the session's Prefect server stored it (polled: stored in batches)."""
    import json
    import urllib.request

    from prefect.settings import PREFECT_API_URL

    body = json.dumps({"filter": {"event": {"name": [name]}, "resource": {"labels": {"recall.run_id": [run_id]}}}})
    request = urllib.request.Request(
        f"{PREFECT_API_URL.value()}/events/filter", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(request, timeout=10) as resp:
            found = json.loads(resp.read())["events"]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, f"{name} of run {run_id}: {found}"
            return dict(found[0])
        time.sleep(0.5)


@pytest.mark.concurrency
def test_sigkill_of_one_worker_process_then_rerun_gives_every_row_once(prefect_harness, judge_env, tmp_path):
    """``kill -9`` of one pool worker mid-run: one ``error:`` line, exit 4, nothing committed, no worker left;
    the same command then resumes the run: every row once, the threads run's scores, fewer judge calls."""
    import json
    import signal
    import subprocess
    import sys

    from tests.test_caching import ROOT, cli_env

    rows = make_rows(120, seed=21)
    data = write_parquet(tmp_path / "eval.parquet", rows, row_group_size=40)
    assert run(data, tmp_path / "threads", judge_env.base_url)["scored"] == 120
    fresh = len(judge_env.chat_requests)  # a fresh run's judge calls: one per row

    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", judge_env.base_url, "--chunk-size", "10", "--max-concurrency", "4",
           "--task-runner", "processes", "--workers", "2"]  # fmt: skip
    judge_env.latency_s = 0.1  # ~0.3 s a chunk: the kill lands with chunks done and chunks in flight
    proc = subprocess.Popen(cmd, env=cli_env(judge_env), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    assert judge_env.wait_for_requests(30, timeout=90), proc.communicate()[0] if proc.poll() is not None else ""
    pool = _children(proc.pid)
    assert len(pool) == 2, pool
    os.kill(pool[0], signal.SIGKILL)  # one worker, not the flow's process
    output, _ = proc.communicate(timeout=60)
    lines = [line for line in output.splitlines() if line.strip()]
    assert proc.returncode == 4, output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output and len(lines) <= 3, output
    assert errors[0].startswith("error: a worker process died (") and errors[0].endswith(
        "nothing committed; rerun the same command to resume"
    ), errors[0]
    assert not _alive(pool[1])  # the pool took its other worker down: no orphan judging on
    assert not (out / "results").exists() and not (out / "runs").exists()  # nothing committed, nothing half
    (marker,) = (out / "_pending").glob("*.json")
    killed_run_id = json.loads(marker.read_text())["run_id"]
    died = _alert_event("recall.run.failed", killed_run_id)  # a person is told, though nothing was committed
    assert died["payload"]["committed"] is False and "a worker process died" in died["payload"]["reason"], died
    assert "rerun the same command to resume" in died["payload"]["message"], died
    before = len(judge_env.chat_requests)
    assert before < fresh

    judge_env.latency_s = 0.0
    rerun = subprocess.run(cmd, env=cli_env(judge_env), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    again = len(judge_env.chat_requests) - before
    assert 0 < again < fresh  # the chunks finished before the kill were not judged again
    assert before + again <= fresh + 2 * 10  # at most the two chunks in flight at the kill judged twice
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert [r["run_id"] for r in runs] == [killed_run_id]  # the rerun resumed the killed run
    ids = DeltaTable(str(out / "results")).to_pyarrow_table().column("row_id").to_pylist()
    assert sorted(ids) == sorted(r["row_id"] for r in rows)  # every row exactly once
    assert table(out) == table(tmp_path / "threads")
    assert not list((out / "_pending").glob("*.json"))


@pytest.mark.concurrency
def test_two_local_dask_clusters_on_one_host_serve_http_on_free_loopback_ports():
    """The product's LocalCluster once served its scheduler's HTTP on 8787: a second cluster on the host (a
    second run, a concurrent test) warned "Port 8787 is already in use", an error under warnings-as-errors. Held
    here on purpose, both clusters start without a warning, each on its own loopback port, with no dashboard."""
    import contextlib
    import socket
    import warnings

    from recall_tasks.pipeline.flow import task_runner

    params = RunParams(dataset_uri="d.parquet", output_uri="/tmp/out", task_runner="dask", workers=1)
    with contextlib.ExitStack() as stack:
        holder = stack.enter_context(socket.socket())
        with contextlib.suppress(OSError):  # already held elsewhere: the same condition
            holder.bind(("127.0.0.1", 8787))
            holder.listen()
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("error")
        runners = [stack.enter_context(task_runner(params)) for _ in range(2)]  # type: ignore[arg-type]
        servers = [r.client and r._cluster.scheduler.http_server for r in runners]
        assert {s.address for s in servers} == {"127.0.0.1"}
        ports = {s.port for s in servers}
        assert len(ports) == 2 and 8787 not in ports
