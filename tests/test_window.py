"""The chunk loop without Prefect: a thread-pool executor stands in for the adapter's tasks."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from recall_tasks.config import RunParams
from recall_tasks.errors import RunInterrupted
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.pipeline import commit, steps
from recall_tasks.pipeline.steps import ChunkReport, RunPlan
from recall_tasks.pipeline.window import score_chunks
from tests.test_pipeline import make_rows, write_parquet


class PoolHandle:
    def __init__(self, future: Future[ChunkReport]) -> None:
        self.future = future

    def wait(self, timeout: float) -> bool:
        try:
            self.future.exception(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def report(self) -> ChunkReport:
        return self.future.result()


class PoolExecutor:
    """Scores chunks on threads, counting what is in flight."""

    def __init__(self, plan: RunPlan, fail_seq: int | None = None):
        self.plan = plan
        self.pool = ThreadPoolExecutor(4)
        self.fail_seq = fail_seq
        self.submitted: list[int] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.progress_calls: list[tuple[int, int, bool]] = []

    def _run(self, seq: int, key: str) -> ChunkReport:
        try:
            if seq == self.fail_seq:
                raise ValueError(f"chunk {seq} broke")
            return steps.score_chunk(self.plan, seq, self.plan.pending_blocks[seq], key)
        finally:
            with self.lock:
                self.in_flight -= 1

    def submit(self, seq: int, key: str) -> PoolHandle:
        self.submitted.append(seq)
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return PoolHandle(self.pool.submit(self._run, seq, key))

    def progress(self, done_rows: int, total_rows: int, *, final: bool) -> None:
        self.progress_calls.append((done_rows, total_rows, final))


@pytest.fixture
def data(tmp_path: Path) -> str:
    return write_parquet(tmp_path / "data" / "d.parquet", make_rows(45))


def plan_for(data: str, out: Path, **kw: object) -> RunPlan:
    params = RunParams(dataset_uri=data, output_uri=str(out), judge="lexical", chunk_size=5, max_workers=2, **kw)
    return steps.plan_run(params)


def test_every_chunk_is_scored_once_with_at_most_max_workers_in_flight(data: str, tmp_path: Path) -> None:
    plan = plan_for(data, tmp_path / "out")
    executor = PoolExecutor(plan)
    tally = score_chunks(plan, executor)
    assert executor.submitted == list(range(9))
    assert executor.max_in_flight <= 2
    assert tally.done_rows == 45 and len(tally.parts) == 9
    assert plan.pending_blocks == {}  # every parked block released once settled
    assert executor.progress_calls[-1] == (45, 45, True)
    assert [c[0] for c in executor.progress_calls[:-1]] == sorted(c[0] for c in executor.progress_calls[:-1])
    summary = commit.commit_run(plan, tally.parts)
    assert summary["rows"] == 45 and summary["errors"] == 0


def test_a_rerun_submits_every_chunk_and_the_row_cache_serves_its_rows(data: str, tmp_path: Path) -> None:
    first = plan_for(data, tmp_path / "out")
    commit.commit_run(first, score_chunks(first, PoolExecutor(first)).parts)
    steps.finish_run(first)

    second = plan_for(data, tmp_path / "out")
    executor = PoolExecutor(second)
    tally = score_chunks(second, executor)
    assert executor.submitted == list(range(9)) and tally.done_rows == 45
    assert all(p.path.endswith(f"/{second.run_id}.parquet") for p in tally.parts)  # this run's own files
    summary = commit.commit_run(second, tally.parts)
    assert summary["cached"] == 45 and summary["requests"] == 0


def test_an_error_aborts_the_run_and_flushes_what_was_judged(data: str, tmp_path: Path) -> None:
    plan = plan_for(data, tmp_path / "out")
    told: list[int] = []
    observer = SimpleNamespace(progress=lambda done, total: None, rows=lambda seq, n: None, aborted=told.append)
    with pytest.raises(ValueError, match="chunk 3 broke"):
        score_chunks(plan, PoolExecutor(plan, fail_seq=3), observer)
    assert plan.scope.cancelled  # judge calls in flight are cancelled, later chunks refuse to start
    assert told and told[0] >= 5  # the rows judged before the error are in the row cache
    with pytest.raises(RunInterrupted):
        steps.score_chunk(plan, 99, next(iter_blocks(plan.dataset, 5)), "k")


def test_the_publishing_tail_says_what_to_send_without_prefect(data: str, tmp_path: Path) -> None:
    """publish_run returns the artifacts and events in order; the first run of a series has no comparison."""
    import logging

    from recall_tasks.pipeline import publish

    logger = logging.getLogger("test-publish")
    first = plan_for(data, tmp_path / "out", label="v1")
    committed = commit.commit_run(first, score_chunks(first, PoolExecutor(first)).parts)
    summary, out = publish.publish_run(first, committed, logger)
    steps.finish_run(first)
    assert [(a.kind, a.key) for a in out.artifacts] == [
        ("table", "recall-summary-d-contextual-recall"),
        ("link", "recall-results"),
        ("markdown", "recall-report-d-contextual-recall"),
        ("link", "recall-html-d-contextual-recall"),
    ]
    assert [e.name for e in out.events] == ["recall.run.completed"]
    assert Path(summary["report_uri"]).is_file() and "comparison" not in summary

    second = plan_for(data, tmp_path / "out", label="v2")
    committed = commit.commit_run(second, score_chunks(second, PoolExecutor(second)).parts)
    summary, out = publish.publish_run(second, committed, logger)
    assert summary["comparison"]["verdict"] == "unchanged"
    assert [a.kind for a in out.artifacts].count("markdown") == 2  # the comparison and the report
    assert [e.name for e in out.events] == ["recall.run.completed"]
    publish.raise_for_outcome(second, summary)  # completed and unchanged: no exception
