"""Object storage down mid-run: what was paid is kept where a rerun finds it, and the run ends with exit 4.

The suite's real SeaweedFS server holds the output; it is stopped while the run judges and stays down until the run
has ended. The row cache cannot be saved there: its segments go to the local spill (under the state directory),
and the rerun, once the store is back, uploads them and takes its verdicts from there instead of paying again.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recall_tasks.io.cache import RowVerdictCache, spill_dir
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.base import JudgeResponse, JudgeVerdict
from tests import judge_script
from tests.test_caching import ROOT, cli_env
from tests.test_pipeline import KEY, make_rows, write_parquet


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def response(n: int) -> JudgeResponse:
    return JudgeResponse(verdicts=[JudgeVerdict(id=1, verdict="yes", chunk_ids=[1])], model="m", prompt_version=str(n))


@pytest.mark.concurrency
def test_a_cache_that_cannot_reach_its_store_spills_locally_and_the_next_one_uploads_it(s3_server, s3_bucket):
    uri = f"s3://{s3_bucket}/out/cache"
    storage = StorageConfig.from_options({**s3_server.storage_options(), "connect_timeout": "1", "max_attempts": "1"})
    cache = RowVerdictCache(uri, storage)
    cache.put_many({"a": response(1)})
    cache.flush()
    s3_server.stop()
    try:
        cache.put_many({"b": response(2), "c": response(3)})
        cache.flush()  # the store is down: spilled, not lost, not raised
        assert cache.spilled == 2 and cache.stored == 1
        assert set(cache.get_many(["b", "c"])) == {"b", "c"}  # this process still finds them
        (segment,) = spill_dir(uri).glob("seg-*.parquet")
        assert sorted(pq.read_table(segment).column("key").to_pylist()) == ["b", "c"]
    finally:
        s3_server.start()
    again = RowVerdictCache(uri, storage)  # the store is back: the spill goes up, and is read from there
    assert set(again.get_many(["a", "b", "c"])) == {"a", "b", "c"}
    assert not list(spill_dir(uri).glob("*.parquet"))


@pytest.mark.concurrency
def test_store_down_mid_run_exits_4_naming_the_store_and_the_rerun_does_not_pay_again(
    prefect_harness, judge_env, s3_server, s3_bucket, tmp_path
):
    """Today: exit 2 ("nothing judged or written") after the rows were paid, and the rerun paid for them again."""
    data = write_parquet(tmp_path / "eval.parquet", make_rows(80, seed=29))
    out = f"s3://{s3_bucket}/out"
    args = [sys.executable, "-m", "recall_tasks", "run", data, "--output", out, "--judge", "openai", "--base-url",
            judge_env.base_url, "--chunk-size", "10", "--max-workers", "1", "--max-concurrency", "4",
            "--storage-option", "connect_timeout=1", "--storage-option", "max_attempts=1"]  # fmt: skip
    env = cli_env(judge_env, **s3_server.env())
    judge_env.latency_s = 0.05
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert judge_env.wait_for_requests(25, timeout=120)
        s3_server.stop()
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        s3_server.start()
    paid = len(judge_env.chat_requests)
    assert proc.returncode == 4, stdout + stderr
    (line,) = [x for x in stderr.splitlines() if x.startswith("error: ")]
    match = re.fullmatch(
        rf"error: run \S+ stopped: object storage failed while judging \(cannot reach endpoint "
        rf"{re.escape(s3_server.endpoint_url)}: .*\); nothing committed to {re.escape(out)}; (\d+) judged rows were "
        r"kept in the row cache's local spill (\S+) \(the row cache could not be saved to the output\): rerun the same "
        r"command once the store is back, they are not paid again",
        line,
    )
    assert match, line
    spilled = int(match.group(1))
    assert 0 < spilled <= paid and Path(match.group(2)).is_dir()
    assert "nothing judged" not in stderr and s3_server.secret_key not in stderr

    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    rerun = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert len(judge_env.chat_requests) <= 80 - spilled  # what the failed attempt paid for is not paid again
    assert not list(Path(match.group(2)).glob("*.parquet"))  # uploaded to the output's row cache
