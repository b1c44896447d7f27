"""One writer at a time on a ``--batch`` run's record (``pipeline/batch/record.py``): compare-and-swap on SeaweedFS
and on local files, and the races it settles: ``batch cancel`` against a waiting run, two collectors that would
each create round 2."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from recall_tasks.config import RunParams
from recall_tasks.io.storage import StorageConfig, filesystem
from recall_tasks.pipeline.batch.record import Record, RecordChanged, read_at, save
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests import s3_server as _s3
from tests.test_batch import record
from tests.test_batch_commands import batch, one_line
from tests.test_pipeline import KEY, make_rows, write_parquet

s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


@pytest.fixture
def s3_output(request, monkeypatch) -> str:
    server = request.getfixturevalue("s3_server")
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    return f"s3://{request.getfixturevalue('s3_bucket')}/out"


def write(fs: Any, path: str, content: dict[str, Any], token: str | None) -> str | None:
    """Save ``content`` as a record read at ``token``; the new token."""
    record = Record(content)
    record.token = token
    save(fs, path, record)
    return record.token


def race(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(i)`` in ``n`` threads released at once; what each returned or raised."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - the race's losers are part of the result
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.concurrency
def test_one_writer_wins_each_race_on_the_record(where, tmp_path, request) -> None:
    output = str(tmp_path / "out") if where == "local" else request.getfixturevalue("s3_output")
    fs, root = filesystem(output, StorageConfig.from_options())
    path = f"{root}/_batches/key.json"
    created = race(6, lambda i: write(fs, path, {"writer": i}, None))  # six create the record at once
    (winner,) = [i for i, r in enumerate(created) if isinstance(r, str)]
    assert all(isinstance(r, RecordChanged) for i, r in enumerate(created) if i != winner), created
    first = read_at(fs, path)
    assert first == {"writer": winner} and first is not None and first.token == created[winner]

    updated = race(6, lambda i: write(fs, path, {"writer": 10 + i}, first.token))  # six update one version
    (winner,) = [i for i, r in enumerate(updated) if isinstance(r, str)]
    assert sum(isinstance(r, RecordChanged) for r in updated) == 5
    assert read_at(fs, path) == {"writer": 10 + winner}
    with pytest.raises(RecordChanged):  # the version it was read at is gone: nothing written
        write(fs, path, {"writer": "stale"}, first.token)
    assert read_at(fs, path) == {"writer": 10 + winner}


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_batch_cancel_stops_a_waiting_run_which_never_resubmits(prefect_harness, judge_env, tmp_path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(6, seed=53))
    out = tmp_path / "out"
    judge_env.batch_hold = True
    params = RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge_env.base_url,
                       chunk_size=7, batch=True, batch_wait=True, poll_interval_s=0.1, batch_timeout_s=20)  # fmt: skip
    got: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: got.update(summary=recall_benchmark(params)))
    waiter.start()
    try:
        # the folder exists a moment before the record is renamed into it
        wait_for(lambda: any((out / "_batches").glob("*.json")) and record(out)["status"] == "pending")
        cancelled = batch("cancel", "-o", str(out), "--base-url", judge_env.base_url)
    finally:
        waiter.join(60)
    assert cancelled.exit_code == 0, cancelled.output
    summary = got["summary"]
    assert summary["status"] == "batch_idle", summary  # stopped at its next check, long before --batch-timeout
    assert f"another process left the batches of run {summary['run_id']} cancelled" in one_line(summary["reason"])
    assert len(judge_env.batches) == 1 and judge_env.stats["batch:create"] == 1  # never resubmitted
    assert record(out)["status"] == "cancelled" and record(out)["parts"][0]["status"] == "cancelled"


@pytest.mark.concurrency
def test_two_collectors_create_round_two_once(prefect_harness, judge_env, s3_output, tmp_path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(8, seed=59))
    params = RunParams(dataset_uri=data, output_uri=s3_output, judge="openai", base_url=judge_env.base_url,
                       chunk_size=7, batch=True)  # fmt: skip
    judge_env.batch_hold = True
    assert recall_benchmark(params)["status"] == "batch_pending"
    judge_env.finish_batches("expired")  # half the lines unanswered: each collector would resubmit them
    judge_env.latency_s = 1.0  # every Batch API call: both collectors between reading and writing the record (at
    # 0.3 s the old code was not caught: the threads did not overlap)
    summaries = race(2, lambda _: recall_benchmark(params))
    judge_env.latency_s = 0.0
    # one live attempt per run (io/lease.py): the second collector is refused; the record's compare-and-swap
    # stays the guard should both ever run (a lease taken over from a stalled collector)
    refused = [s for s in summaries if isinstance(s, Exception)]
    assert len(refused) == 1 and str(refused[0]).startswith("run in progress: "), summaries
    assert [s["status"] for s in summaries if not isinstance(s, Exception)] == ["batch_pending"], summaries
    assert judge_env.stats["batch:create"] == 2  # round 1, and round 2 once
    fs, root = filesystem(s3_output, StorageConfig.from_options())
    ((_, stored),) = [(p, read_at(fs, p)) for p in fs.find(f"{root}/_batches") if p.endswith(".json")]
    assert stored is not None and [p["round"] for p in stored["parts"]] == [1, 2] and stored["resubmitted"] == 4
