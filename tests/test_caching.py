"""Caching across runs, crash-safe resume, fault tolerance and budgets, with real servers and real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.errors import BudgetExhausted, RunFailed, StorageError
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.base import JudgeResponse, JudgeVerdict
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.fake_openai import Reset, Status
from tests.test_pipeline import KEY, expected, make_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def write(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=100)
    return str(path)


def run(judge, data: str, out: Path | str, **kw):
    kw.setdefault("chunk_size", 10)
    return recall_benchmark(
        RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge.base_url, **kw)
    )


def results_of(out: Path, run_id: str) -> dict[str, dict]:
    table = DeltaTable(str(out / "results")).to_pyarrow_table()
    rows = [r for r in table.to_pylist() if r["run_id"] == run_id]
    by_id = {r["row_id"]: r for r in rows}
    assert len(by_id) == len(rows), "a row appears twice in one run"
    return by_id


def test_unchanged_rerun_makes_zero_calls_with_identical_scores(prefect_harness, judge_env, tmp_path):
    rows = make_rows(60)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    first = run(judge_env, data, out)
    assert first["requests"] == 60 and first["cached"] == 0
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    second = run(judge_env, data, out)
    assert judge_env.chat_requests == [] and second["requests"] == 0
    assert second["cached"] == 60 and second["mean_score"] == first["mean_score"]
    a, b = results_of(out, first["run_id"]), results_of(out, second["run_id"])
    assert {k: r["score"] for k, r in a.items()} == {k: r["score"] for k, r in b.items()}
    assert all(r["cached"] and r["prompt_tokens"] == 0 for r in b.values())
    assert not any(r["cached"] for r in a.values())


def test_row_cache_alone_serves_an_unchanged_rerun(prefect_harness, judge_env, tmp_path):
    """Different chunking defeats the chunk cache; the row cache still answers every row."""
    rows = make_rows(40)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    run(judge_env, data, out, chunk_size=10)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    second = run(judge_env, data, out, chunk_size=7)
    assert judge_env.chat_requests == [] and second["cached"] == 40
    segments = list((out / "cache").glob("*.parquet"))
    assert len(segments) in (1, 2), segments  # compacted, never one object per row


def test_one_percent_edit_rejudges_only_edited_rows(prefect_harness, judge_env, tmp_path):
    rows = make_rows(300, seed=11)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    run(judge_env, data, out, chunk_size=50)
    edited = [dict(r) for r in rows]
    for i in (5, 77, 150):
        edited[i]["ground_truth"] = edited[i]["ground_truth"] + " Oscar papa quebec."
    data2 = write(tmp_path / "eval2" / "eval.parquet", edited)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    summary = run(judge_env, data2, out, chunk_size=50)
    assert 3 <= len(judge_env.chat_requests) <= 6
    got = results_of(out, summary["run_id"])
    for i in (5, 77, 150):
        row = got[edited[i]["row_id"]]
        assert not row["cached"] and row["score"] == pytest.approx(expected(edited[i]))
    assert sum(r["cached"] for r in got.values()) == 297


@pytest.mark.parametrize(
    "change",
    [{"model": "gpt-4.1-mini"}, {"include_reason": False}, {"metric": "context_coverage"}],
    ids=["judge-model", "judge-parameter", "metric"],
)
def test_config_changes_invalidate_the_cache(prefect_harness, judge_env, tmp_path, change):
    rows = make_rows(20)
    for r in rows:
        r["response"] = r["ground_truth"]
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    run(judge_env, data, out)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    summary = run(judge_env, data, out, **change)
    assert len(judge_env.chat_requests) == 20 and summary["cached"] == 0
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    again = run(judge_env, data, out, **change)
    assert judge_env.chat_requests == [] and again["cached"] == 20


def test_threshold_change_reuses_verdicts_but_rescores(prefect_harness, judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(20))
    out = tmp_path / "out"
    first = run(judge_env, data, out, threshold=0.5)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    strict = run(judge_env, data, out, threshold=1.0)
    assert judge_env.chat_requests == [] and strict["cached"] == 20
    assert strict["pass_rate"] <= first["pass_rate"]
    assert all(r["threshold"] == 1.0 for r in results_of(out, strict["run_id"]).values())


def test_prompt_version_invalidates(prefect_harness, judge_env, tmp_path, monkeypatch):
    from recall_tasks.judges.openai_judge import OpenAIJudge

    data = write(tmp_path / "eval.parquet", make_rows(10))
    out = tmp_path / "out"
    run(judge_env, data, out)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    original = OpenAIJudge.config
    monkeypatch.setattr(OpenAIJudge, "config", lambda self: {**original(self), "prompt_version": "v2"})
    summary = run(judge_env, data, out)
    assert len(judge_env.chat_requests) == 10 and summary["cached"] == 0


def test_refresh_and_no_cache(prefect_harness, judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(15))
    out = tmp_path / "out"
    run(judge_env, data, out)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    refreshed = run(judge_env, data, out, refresh_cache=True)
    assert len(judge_env.chat_requests) == 15 and refreshed["cached"] == 0
    fresh_out = tmp_path / "fresh"
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    run(judge_env, data, fresh_out, cache=False)
    run(judge_env, data, fresh_out, cache=False)
    assert len(judge_env.chat_requests) == 30
    assert not (fresh_out / "cache").exists() or not any((fresh_out / "cache").iterdir())


def test_budget_stops_judging_cleanly(prefect_harness, judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(40))
    out = tmp_path / "out"
    with pytest.raises(BudgetExhausted) as stopped:  # the flow run ends Failed: a partial run
        run(judge_env, data, out, max_requests=12, max_workers=1, max_concurrency=4)
    summary = stopped.value.summary
    assert len(judge_env.chat_requests) <= 12
    assert summary["status"] == "budget_exhausted" and "--max-requests 12" in summary["status_reason"]
    got = results_of(out, summary["run_id"])
    assert len(got) == 40
    not_judged = [r for r in got.values() if r["reason"] and r["reason"].startswith("not judged")]
    assert len(not_judged) == 40 - summary["scored"] and summary["not_judged"] == len(not_judged) >= 28
    assert summary["skipped"] == 0
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert runs[0]["status"] == "budget_exhausted"


def test_transient_and_malformed_faults_never_give_a_wrong_score(prefect_harness, judge_env, tmp_path):
    rows = make_rows(150, seed=21)
    data = write(tmp_path / "eval.parquet", rows)
    judge_env.fault_rate = 0.2
    judge_env.malformed_rate = 0.05
    judge_env.seed = 4
    summary = run(judge_env, data, tmp_path / "out", chunk_size=25)
    got = results_of(tmp_path / "out", summary["run_id"])
    assert len(got) == 150
    errored = [r for r in got.values() if r["error"]]
    for r in rows:
        row = got[r["row_id"]]
        if row["error"] is None:
            assert row["score"] == pytest.approx(expected(r)), r["row_id"]
        else:
            assert row["score"] is None and row["error"].startswith(("JudgeTransientError", "JudgeResponseError"))
    assert summary["scored"] + len(errored) == 150 and len(errored) <= 8
    assert judge_env.stats["ok"] >= summary["scored"]  # every scored row had a well-formed answer
    faults = sum(n for k, n in judge_env.stats.items() if k.startswith("fault:"))
    assert faults >= 15  # ~20 % of the requests really failed


# -- processes killed with SIGKILL ---------------------------------------------------------------


def cli_env(judge, **extra: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "OPENAI_API_KEY": KEY,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("RECALL_BENCH_CRASH_AT", None)
    return {**env, **extra}


def cli_run(judge, data: str, out: Path, env: dict[str, str], chunk_size: int = 10) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "recall_tasks",
        "run",
        data,
        "--output",
        str(out),
        "--judge",
        "openai",
        "--base-url",
        judge.base_url,
        "--chunk-size",
        str(chunk_size),
        "--max-concurrency",
        "8",
    ]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.concurrency
def test_sigkill_during_judging_then_rerun_resumes(prefect_harness, judge_env, tmp_path):
    rows = make_rows(120, seed=8)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    judge_env.latency_s = 0.05
    proc = cli_run(judge_env, data, out, cli_env(judge_env))
    assert judge_env.wait_for_requests(50, timeout=120), proc.communicate()[0] if proc.poll() is not None else ""
    proc.send_signal(signal.SIGKILL)
    proc.communicate()  # reaps it and closes its output pipe
    before = len(judge_env.chat_requests)
    assert not (out / "results").exists() and not (out / "runs").exists()
    (marker,) = (out / "_pending").glob("*.json")
    killed_run_id = json.loads(marker.read_text())["run_id"]
    judge_env.latency_s = 0.0
    rerun = cli_run(judge_env, data, out, cli_env(judge_env))
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    total = len(judge_env.chat_requests)
    assert total - before <= 120 - before + 4 * 10 + 8  # at most the chunks in flight at the kill
    assert total < 120 + 4 * 10 + 8
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert len(runs) == 1
    got = results_of(out, runs[0]["run_id"])
    assert set(got) == {r["row_id"] for r in rows}
    assert all(got[r["row_id"]]["score"] == pytest.approx(expected(r)) for r in rows)
    assert runs[0]["run_id"] == killed_run_id  # the rerun resumed the killed attempt's run
    assert not list((out / "_pending").glob("*.json"))


@pytest.mark.parametrize("fmt", ["delta", "parquet", "iceberg"])
@pytest.mark.concurrency
def test_sigkill_between_results_and_runs_commit(prefect_harness, judge_env, tmp_path, fmt):
    rows = make_rows(30, seed=9)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    env = cli_env(judge_env, RECALL_BENCH_CRASH_AT="after-results-commit")
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", judge_env.base_url, "--chunk-size", "10", "--format", fmt]  # fmt: skip
    proc = subprocess.run(
        cmd,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL
    store = ResultStore(str(out), StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    assert store.read_table("runs") is None
    if fmt == "iceberg":  # the results commit landed before the kill: the rerun must not append it again
        assert store.read_table("results").count_rows() == 30
    if fmt == "parquet":  # readers see no rows of an uncommitted run
        assert store.read_table("results") is None or store.read_table("results").count_rows() == 0
    requests_before = len(judge_env.chat_requests)
    proc = subprocess.run(
        cmd,
        env=cli_env(judge_env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(judge_env.chat_requests) == requests_before == 30
    runs = store.read_table("runs").to_table().to_pylist()
    assert len(runs) == 1
    results = store.read_table("results").to_table().to_pylist()
    assert sorted(r["row_id"] for r in results) == sorted(r["row_id"] for r in rows)
    assert {r["run_id"] for r in results} == {runs[0]["run_id"]}


@pytest.mark.concurrency
def test_two_runs_at_once_do_not_corrupt(prefect_harness, judge_env, tmp_path):
    rows = make_rows(80, seed=13)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    judge_env.latency_s = 0.02
    procs = [cli_run(judge_env, data, out, cli_env(judge_env)) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    # one live attempt per run (io/lease.py): the second, if it meets the first judging, is refused in one line
    assert sorted(p.returncode for p in procs) in ([0, 0], [0, 2]), outputs
    refused = [o for p, o in zip(procs, outputs, strict=True) if p.returncode]
    assert all("error: run in progress: run " in o for o in refused), outputs
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert len({r["run_id"] for r in runs}) == len(runs) >= 1
    for r in runs:
        got = results_of(out, r["run_id"])
        assert set(got) == {x["row_id"] for x in rows}
        assert all(got[x["row_id"]]["score"] == pytest.approx(expected(x)) for x in rows)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    summary = run(judge_env, data, out)
    assert judge_env.chat_requests == [] and summary["cached"] == 80


@pytest.mark.concurrency
def test_same_run_committed_by_two_processes_at_once_lands_once(tmp_path, monkeypatch, caplog):
    """Both writers pass the "already committed?" check, then both append: Delta's app transaction id makes
    the second commit conflict, and the loser sees the winner's commit instead of duplicating the run."""
    import deltalake

    from recall_tasks.io.results import ChunkPart

    store = ResultStore(str(tmp_path / "out"), StorageConfig.from_options())
    chunk = store.chunk_path("ab" * 16, "run-1")
    store.write_chunk(chunk, pa.table({"row_id": ["a", "b", "c"], "score": [1.0, 0.5, 0.0]}))
    barriers = {"results": threading.Barrier(2, timeout=30), "runs": threading.Barrier(2, timeout=30)}
    held: set[tuple[int, str]] = set()
    real_write = deltalake.write_deltalake

    def write_after_both_checked(table, *args, **kwargs):
        # each writer's first append to a table waits for the other's: a retry after a commit conflict (the two
        # creates of `runs` can land as two metadata versions) must not wait for a second party that never comes
        name = table.table_uri.rstrip("/").rsplit("/", 1)[-1]
        if (threading.get_ident(), name) not in held:
            held.add((threading.get_ident(), name))
            barriers[name].wait()
        return real_write(table, *args, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", write_after_both_checked)
    run_row = {"run_id": "run-1", "dataset": "d", "rows": 3}
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            ResultStore(str(tmp_path / "out"), StorageConfig.from_options()).commit(
                "run-1", "d", "2026-11-30", [ChunkPart(chunk)], [run_row]
            )
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    caplog.set_level("INFO", logger="recall_tasks.io.results")
    threads = [threading.Thread(target=commit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert "committed by a concurrent writer" in caplog.text  # the conflict path ran
    results = DeltaTable(str(tmp_path / "out" / "results")).to_pyarrow_table()
    assert sorted(results.column("row_id").to_pylist()) == ["a", "b", "c"]
    assert DeltaTable(str(tmp_path / "out" / "runs")).to_pyarrow_table().num_rows == 1
    store.commit("run-1", "d", "2026-11-30", [ChunkPart(chunk)], [run_row])  # a later rerun: still once
    assert DeltaTable(str(tmp_path / "out" / "results")).to_pyarrow_table().num_rows == 3


@pytest.mark.concurrency
def test_object_store_outage_mid_run(prefect_harness, judge_env, s3_server, s3_bucket, monkeypatch, tmp_path):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    rows = make_rows(60, seed=17)
    data = write(tmp_path / "eval.parquet", rows)
    out = f"s3://{s3_bucket}/out"
    judge_env.latency_s = 0.05
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["summary"] = run(
                judge_env, data, out, max_workers=2, storage_options={"connect_timeout": "2", "max_attempts": "2"}
            )
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    assert judge_env.wait_for_requests(15, timeout=60)
    s3_server.stop()
    time.sleep(1.5)
    s3_server.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    store = ResultStore(out, StorageConfig.from_options())
    if "error" in outcome:
        assert isinstance(outcome["error"], StorageError), outcome["error"]
        assert store.read_table("runs") is None
        assert store.read_table("results") is None
    else:
        summary = outcome["summary"]
        assert summary["rows"] == 60  # type: ignore[index]
        results = store.read_table("results").to_table().to_pylist()
        assert sorted(r["row_id"] for r in results) == sorted(r["row_id"] for r in rows)
        assert all(
            r["score"] == pytest.approx(expected(x))
            for r, x in zip(
                sorted(results, key=lambda r: r["row_id"]), sorted(rows, key=lambda r: r["row_id"]), strict=True
            )
        )


class _PlantedRecord:
    """Unpickling this creates ``marker``: proof that a record found in storage ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_no_record_in_prefect_result_storage_is_ever_unpickled(prefect_harness, judge_env, tmp_path):
    """Issue 58.2: Prefect's chunk cache loaded cloudpickle records from its storage; anyone who could write there
    (a shared prefix, a catch-all server named by a parameter) ran code on the worker. A run persists no record,
    and a record planted at the name the chunk cache used is never read."""
    from prefect.results import ResultRecord, ResultRecordMetadata
    from prefect.serializers import PickleSerializer
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    storage = Path(PREFECT_LOCAL_STORAGE_PATH.value())
    before = set(storage.glob("recall-chunk-*")) if storage.exists() else set()
    data = write(tmp_path / "eval.parquet", make_rows(20, seed=23))
    out = tmp_path / "out"
    first = run(judge_env, data, out)
    assert (set(storage.glob("recall-chunk-*")) if storage.exists() else set()) == before  # nothing persisted
    marker = tmp_path / "planted-record-ran"
    keys = {p.name for p in (out / "_chunks").glob("*/*")}
    assert len(keys) == 2
    storage.mkdir(parents=True, exist_ok=True)
    for key in keys:
        record = ResultRecord(
            result=_PlantedRecord(marker),
            metadata=ResultRecordMetadata(storage_key=f"recall-chunk-{key}", serializer=PickleSerializer()),
        )
        (storage / f"recall-chunk-{key}").write_bytes(record.serialize())
    shutil.rmtree(out / "cache")  # the old chunk cache would answer from the planted records now
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    second = run(judge_env, data, out)
    assert not marker.exists()
    assert second["requests"] == 20 and second["mean_score"] == first["mean_score"]


@pytest.mark.parametrize("given", [{"chunk_cache_storage": "http://127.0.0.1:9/"}, {"chunk_cache_days": 3}])
def test_the_removed_chunk_cache_options_are_refused_by_name(given):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=f"{next(iter(given))} was removed with Prefect's chunk cache"):
        RunParams(dataset_uri="d.parquet", **given)
    unset = RunParams.model_validate({"dataset_uri": "d.parquet", "chunk_cache_storage": "", "chunk_cache_days": 30})
    assert "chunk_cache_storage" not in unset.model_dump()


def _chunk_task_runs(flow_run_id: str) -> list:
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])))
    return [r for r in runs if r.name.startswith("score-chunk")]


def test_an_unchanged_rerun_is_served_by_the_row_cache_in_one_task_per_chunk(prefect_harness, judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(40, seed=31))
    out = tmp_path / "out"
    first = run(judge_env, data, out)
    assert len(_chunk_task_runs(first["flow_run_id"])) == 4
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    second = run(judge_env, data, out)
    assert judge_env.chat_requests == [] and second["cached"] == 40
    assert len(_chunk_task_runs(second["flow_run_id"])) == 4
    a, b = results_of(out, first["run_id"]), results_of(out, second["run_id"])
    assert {k: r["score"] for k, r in a.items()} == {k: r["score"] for k, r in b.items()}


def test_pruned_chunk_files_are_judged_again(prefect_harness, judge_env, tmp_path):
    """An earlier run's chunk files and row cache gone: every row goes back to the judge, none is lost."""
    import shutil

    rows = make_rows(30, seed=37)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    run(judge_env, data, out)
    shutil.rmtree(out / "cache")
    shutil.rmtree(out / "_chunks")
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    second = run(judge_env, data, out)
    assert second["requests"] == 30 and second["cached"] == 0 and second["errors"] == 0
    assert len(_chunk_task_runs(second["flow_run_id"])) == 3
    got = results_of(out, second["run_id"])
    assert {k: r["score"] for k, r in got.items()} == {r["row_id"]: expected(r) for r in rows}


def _response(i: int) -> JudgeResponse:
    verdicts = [JudgeVerdict(id=1, verdict="yes" if i % 3 else "no", reason=f"r{i}", chunk_ids=[i % 5 + 1])]
    return JudgeResponse(verdicts=verdicts, model="m", prompt_version="v", prompt_tokens=i)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_row_cache_lookup_reads_only_the_row_groups_it_needs(where, tmp_path, request, monkeypatch):
    """After compaction a lookup still reads the row groups holding its keys, never the whole cache."""
    if where == "s3":
        server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        uri = f"s3://{bucket}/cache"
    else:
        uri = str(tmp_path / "cache")
    storage = StorageConfig.from_options()
    writer = RowVerdictCache(uri, storage, flush_rows=500)
    for start in range(0, 5000, 100):  # 10 flushes of 500 entries, like 10 chunks judged in turn
        writer.put_many({f"k{i}": _response(i) for i in range(start, start + 100)})
    writer.close()
    reader = RowVerdictCache(uri, storage)
    assert reader.size == 5000 and len(reader._segments) == 1  # compacted into one file
    one_chunk = [f"k{i}" for i in range(1500, 1600)]
    found = reader.get_many(one_chunk + ["missing"])
    assert reader.row_groups_read == 1
    assert set(found) == set(one_chunk)
    assert all(found[f"k{i}"] == _response(i) for i in range(1500, 1600))
    across = reader.get_many(["k0", "k2499", "k4999"])
    assert reader.row_groups_read == 4
    assert [across[k].prompt_tokens for k in ("k0", "k2499", "k4999")] == [0, 2499, 4999]


# -- only successes are cached: failed chunks are judged again on the next run -------------------


def _fresh(judge) -> None:
    judge.reset()
    judge.set_responder(judge_script.responder)


def _all_scored_right(out: Path, summary: dict, rows: list[dict]) -> None:
    got = results_of(out, summary["run_id"])
    assert {k: r["score"] for k, r in got.items()} == pytest.approx({r["row_id"]: expected(r) for r in rows})
    assert all(r["error"] is None for r in got.values())


def test_outage_then_healthy_rerun_judges_every_row(prefect_harness, judge_env, tmp_path):
    """The judge goes down after the pre-flight probe (every chat request reset): the rerun with the judge back
    judges the rows, none is served from a cache as an error."""
    rows = make_rows(40, seed=51)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    judge_env.enqueue(*[Reset()] * 400)
    with pytest.raises(RunFailed) as info:
        run(judge_env, data, out)
    first = info.value.summary
    assert first["scored"] == 0 and first["status"] == "failed"
    assert "connection reset by the server" in first["status_reason"]
    _fresh(judge_env)
    second = run(judge_env, data, out)
    assert len(judge_env.chat_requests) == 40 and second["requests"] == 40
    assert second["scored"] == 40 and second["errors"] == 0 and second["cached"] == 0
    assert second["status"] == "completed"
    _all_scored_right(out, second, rows)
    assert len(_chunk_task_runs(second["flow_run_id"])) == 4  # every failed chunk went through its task again
    _fresh(judge_env)
    third = run(judge_env, data, out)
    assert judge_env.chat_requests == [] and third["cached"] == 40 and third["scored"] == 40


def test_budget_stop_then_rerun_without_budget_judges_the_rest(prefect_harness, judge_env, tmp_path):
    rows = make_rows(40, seed=53)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    with pytest.raises(BudgetExhausted) as stopped:
        run(judge_env, data, out, max_requests=12, max_workers=1, max_concurrency=4)
    first = stopped.value.summary
    assert first["status"] == "budget_exhausted" and first["not_judged"] == 40 - first["scored"] >= 28
    _fresh(judge_env)
    second = run(judge_env, data, out)
    assert len(judge_env.chat_requests) == 40 - first["scored"] == second["requests"]
    assert second["scored"] == 40 and second["not_judged"] == 0 and second["cached"] == first["scored"]
    assert second["status"] == "completed" and second["status_reason"] is None
    _all_scored_right(out, second, rows)


def test_rows_left_in_error_by_transient_faults_are_judged_on_rerun(prefect_harness, judge_env, tmp_path):
    rows = make_rows(40, seed=57)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    judge_env.enqueue(*[Status(503)] * 3)  # three rows fail (no retries), far from tripping the breaker
    first = run(judge_env, data, out, max_retries=0, max_error_rate=0.1)  # 3 of 40 in error: not a failed run
    assert first["errors"] == 3 and first["scored"] == 37 and first["status"] == "completed"
    _fresh(judge_env)
    second = run(judge_env, data, out, max_retries=0, max_error_rate=0.1)
    assert len(judge_env.chat_requests) == 3 and second["requests"] == 3
    assert second["errors"] == 0 and second["scored"] == 40 and second["cached"] == 37
    _all_scored_right(out, second, rows)


@pytest.mark.concurrency
def test_entries_put_before_a_sigkill_are_found_by_the_next_cache(tmp_path):
    """The journal: an entry reaches the store as it is put, not when its chunk's flush comes."""
    code = (
        "import os, signal, sys\n"
        "from recall_tasks.io.cache import RowVerdictCache\n"
        "from recall_tasks.io.storage import StorageConfig\n"
        "from recall_tasks.judges.base import JudgeResponse, JudgeVerdict\n"
        "cache = RowVerdictCache(sys.argv[1], StorageConfig.from_options(), flush_rows=10_000)\n"
        "for i in range(25):\n"
        "    v = [JudgeVerdict(id=1, verdict='yes', reason=f'r{i}', chunk_ids=[1])]\n"
        "    cache.put_many({f'k{i}': JudgeResponse(verdicts=v, model='m', prompt_version='p')}, flush=False)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    uri = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", code, uri], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGKILL
    assert not list(Path(uri).glob("seg-*.parquet"))  # nothing was flushed
    cache = RowVerdictCache(uri, StorageConfig.from_options())
    found = cache.get_many([f"k{i}" for i in range(25)])
    assert sorted(found) == sorted(f"k{i}" for i in range(25)) and found["k7"].verdicts[0].reason == "r7"
    assert not list(cache.spill.glob("journal-*"))  # replayed into the store, then gone from the machine
    cache.close()


def test_a_live_caches_journal_is_left_to_it(tmp_path):
    uri = str(tmp_path / "cache")
    live = RowVerdictCache(uri, StorageConfig.from_options(), flush_rows=10_000)
    live.put_many({"k": _response(1)}, flush=False)
    other = RowVerdictCache(uri, StorageConfig.from_options())
    assert other.get_many(["k"]) == {} and len(list(live.spill.glob("journal-*"))) == 1
    live.close()  # flushed: its segment holds the entry, its journal is gone
    assert not list(live.spill.glob("journal-*"))
    assert set(RowVerdictCache(uri, StorageConfig.from_options()).get_many(["k"])) == {"k"}


@pytest.mark.concurrency
def test_a_sigkill_mid_chunk_loses_only_the_calls_in_flight(prefect_harness, judge_env, tmp_path):
    """One 120-row chunk killed after 50 paid calls: the rerun pays for the other 70 (and the few in flight)."""
    rows = make_rows(120, seed=18)
    data = write(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    judge_env.latency_s = 0.05
    proc = cli_run(judge_env, data, out, cli_env(judge_env), chunk_size=500)
    assert judge_env.wait_for_requests(50, timeout=120), proc.communicate()[0] if proc.poll() is not None else ""
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    before = len(judge_env.chat_requests)
    judge_env.latency_s = 0.0
    rerun = cli_run(judge_env, data, out, cli_env(judge_env), chunk_size=500)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    assert len(judge_env.chat_requests) <= 120 + 8, before  # each row paid once, but the 8 calls in flight
    got = results_of(out, DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()[0]["run_id"])
    assert all(got[r["row_id"]]["score"] == pytest.approx(expected(r)) for r in rows)
