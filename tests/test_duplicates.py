"""Identical rows judged once per run: one judge request per row-cache key, whatever the task runner.

Rows with the same content land in one chunk (``io/blocks.plan_layout``), and rows with the same row-cache key share
one request in flight (``pipeline/scoring.SharedRequests``); every row keeps its own results row. Real components:
the fake OpenAI server, Prefect's test server, a process pool.
"""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.io.blocks import iter_blocks, iter_layout, plan_layout, read_rows
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline.flow import recall_benchmark
from recall_tasks.pipeline.scoring import SHARED_FLAG
from tests import judge_script
from tests.fake_openai import extract_user_text
from tests.test_pipeline import KEY, make_rows, write_parquet


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def repeated(distinct: int, copies: int, seed: int) -> list[dict]:
    """``distinct`` rows, each ``copies`` times with its own row id, shuffled."""
    base = make_rows(distinct, seed=seed)
    rows = [{**base[i % distinct], "row_id": f"c{i:03d}"} for i in range(distinct * copies)]
    random.Random(seed).shuffle(rows)
    return rows


def results(out) -> dict[str, dict]:
    return {r["row_id"]: r for r in DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()}


def the_run(out) -> dict:
    (run,) = [r for r in DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist() if r["segment_column"] is None]
    return run


def run(data: str, out, base_url: str, **kw) -> dict:
    return recall_benchmark(RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=base_url, **kw))


def test_identical_rows_land_in_one_chunk_with_their_own_ids_and_positions(tmp_path) -> None:
    """Without a ``row_id`` column too: the ``~N`` ids stay those of dataset order, a worker's re-read is the same
    block, and a dataset without repeats keeps its contiguous blocks."""
    base = [{k: v for k, v in r.items() if k != "row_id"} for r in make_rows(7, seed=3)]
    rows = [base[i % 7] for i in range(30)]
    random.Random(3).shuffle(rows)
    data = write_parquet(tmp_path / "eval.parquet", rows, row_group_size=4)
    ds = open_dataset(data, StorageConfig.from_options())
    plain = {(b.source, b.first_row + i): (rid, h) for b in iter_blocks(ds, 5)
             for i, (rid, h) in enumerate(zip(b.row_ids, b.content_hashes, strict=True))}  # fmt: skip

    layout = plan_layout(ds, 5)
    assert layout.repeats == 23 and layout.chunks is not None
    blocks = list(iter_layout(ds, layout, 5))
    chunk_of: dict[str, set[int]] = {}
    seen = []
    for n, block in enumerate(blocks):
        assert block.positions is not None
        for i, (rid, h) in enumerate(zip(block.row_ids, block.content_hashes, strict=True)):
            assert plain[block.where(i)] == (rid, h)  # the row at that position, with its dataset-order id
            chunk_of.setdefault(h, set()).add(n)
            seen.append(block.where(i))
        assert block.same_as is not None
        again = read_rows(ds, block.positions, block.same_as, block.row_ids)
        assert (again.row_ids, again.content_hashes, again.table) == (block.row_ids, block.content_hashes, block.table)
    assert sorted(seen) == sorted(plain) and all(len(chunks) == 1 for chunks in chunk_of.values())

    distinct = write_parquet(tmp_path / "distinct.parquet", base, row_group_size=4)
    assert plan_layout(open_dataset(distinct, StorageConfig.from_options()), 5).chunks is None


@pytest.mark.parametrize("runner", ["threads", "processes"])
@pytest.mark.concurrency
def test_each_distinct_row_is_judged_once_with_a_results_row_per_row(prefect_harness, judge_env, tmp_path, runner):
    """48 rows that are 8 distinct rows, shuffled, in chunks of 4 rows: 8 requests (before: a request per chunk
    holding a copy, per process), 48 results rows, each copy with its original's verdicts at no cost."""
    data = write_parquet(tmp_path / "eval.parquet", repeated(8, 6, seed=11), row_group_size=10)
    out = tmp_path / "out"
    extra = {"task_runner": runner, "workers": 2} if runner != "threads" else {}
    summary = run(data, out, judge_env.base_url, chunk_size=4, **extra)
    assert summary["status"] == "completed" and summary["scored"] == 48
    assert len(judge_env.chat_requests) == 8 and the_run(out)["requests"] == 8
    got = results(out)
    assert len(got) == 48
    by_question: dict[str, list[dict]] = {}
    for row in got.values():
        by_question.setdefault(row["input"], []).append(row)
    assert sorted(len(copies) for copies in by_question.values()) == [6] * 8
    for copies in by_question.values():
        assert len({(r["score"], str(r["verdicts"])) for r in copies}) == 1
        assert sorted(r["requests"] for r in copies) == [0, 0, 0, 0, 0, 1]
        assert sum(SHARED_FLAG in r["flags"] for r in copies) == 5


def test_rows_with_one_cache_key_in_two_chunks_in_flight_share_the_request(prefect_harness, judge_env, tmp_path):
    """Two rows that differ only in their answer (not part of a recall request): two chunks, both in flight at
    once; the second waits for the first's request instead of sending its own (before: 2 requests)."""
    row = make_rows(1, seed=5)[0]
    rows = [{**row, "row_id": "a", "answer": "one answer"}, {**row, "row_id": "b", "answer": "another answer"}]
    data = write_parquet(tmp_path / "eval.parquet", rows)
    judge_env.latency_s = 0.5
    summary = run(data, tmp_path / "out", judge_env.base_url, chunk_size=1, max_workers=2)
    assert summary["scored"] == 2 and len(judge_env.chat_requests) == 1
    got = results(tmp_path / "out")
    assert got["a"]["score"] == got["b"]["score"]
    assert sorted(r["requests"] for r in got.values()) == [0, 1]


def test_a_shared_request_that_fails_fails_every_copy_and_caches_nothing(prefect_harness, judge_env, tmp_path):
    """Every copy of the row gets the error, the run records the failed request's attempts once, and nothing is
    cached: the next run judges the row again, once."""
    rows = repeated(2, 3, seed=9)
    broken = rows[0]["question"]

    def responder(body):
        return "not json at all" if broken in extract_user_text(body) else judge_script.responder(body)

    judge_env.set_responder(responder)
    data = write_parquet(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    run(data, out, judge_env.base_url, chunk_size=2, max_error_rate=1.0)
    got = results(out)
    failed = [r for r in got.values() if r["error"] is not None]
    assert len(failed) == 3 and len({r["error"] for r in failed}) == 1
    assert all(r["input"] == broken for r in failed)
    attempts = sum(broken in extract_user_text(r["body"]) for r in judge_env.chat_requests)
    assert attempts >= 1 and sorted(r["requests"] for r in failed) == [0, 0, attempts]
    assert the_run(out)["requests"] == len(judge_env.chat_requests) == attempts + 1

    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    run(data, tmp_path / "again", judge_env.base_url, chunk_size=2, cache_uri=str(out / "cache"))
    sent = Counter(broken in extract_user_text(r["body"]) for r in judge_env.chat_requests)
    assert sent == {True: 1}  # the failed row again, once; the good row from the row cache
    assert all(r["error"] is None for r in results(tmp_path / "again").values())


def test_a_dataset_without_row_ids_keeps_its_ids_and_pass_through_values(prefect_harness, judge_env, tmp_path):
    """Grouped chunks hold rows from anywhere in the files: each results row still names its own source row and
    carries its own pass-through value."""
    base = [{k: v for k, v in r.items() if k != "row_id"} for r in make_rows(3, seed=21)]
    rows = [{**base[i % 3], "seq": i} for i in range(12)]
    random.Random(21).shuffle(rows)
    data = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data, row_group_size=5)
    out = tmp_path / "out"
    run(str(data), out, judge_env.base_url, chunk_size=2)
    got = results(out)
    assert len(judge_env.chat_requests) == 3 and len(got) == 12
    for r in got.values():
        assert rows[r["source_row"]]["seq"] == r["seq"]
    assert sorted(rid.partition("~")[2] for rid in got) == sorted(["", "", ""] + ["2", "3", "4"] * 3)


def test_the_cli_judges_each_distinct_row_once(prefect_harness, judge_env, tmp_path) -> None:
    """The CLI's run judges grouped chunks (identical rows in one chunk): no row is judged twice; the dry run before
    it says as many requests as the run then sends."""
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = write_parquet(tmp_path / "eval.parquet", repeated(5, 8, seed=17), row_group_size=7)
    argv = ["run", data, "-o", str(tmp_path / "out"), "--judge", "openai", "--base-url", judge_env.base_url,
            "--chunk-size", "6", "--max-workers", "3"]  # fmt: skip
    dry = CliRunner().invoke(app, [*argv, "--dry-run"], env={"COLUMNS": "300"})
    assert "40 rows, 0 served by the row cache, 5 judge requests" in dry.output, dry.output
    ran = CliRunner().invoke(app, argv, env={"COLUMNS": "300"})
    assert ran.exit_code == 0, ran.output
    assert len(judge_env.chat_requests) == 5 and the_run(tmp_path / "out")["requests"] == 5
    assert len(results(tmp_path / "out")) == 40
