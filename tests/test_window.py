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
from recall_tasks.pipeline import commit, head_start, steps
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


def test_the_head_start_judges_the_first_chunk_once_and_its_task_takes_the_result(
    data: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged: list[str] = []
    real = steps.score_block

    async def counting(metric, block, *args, **kwargs):  # type: ignore[no-untyped-def]
        judged.extend(block.row_ids)
        return await real(metric, block, *args, **kwargs)

    monkeypatch.setattr(steps, "score_block", counting)
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="lexical", chunk_size=5)
    prepared = head_start.preflight(params)
    ahead = head_start.plan_ahead(prepared)
    assert sorted(ahead.head_starts) == [0, 1, 2, 3]  # a window of chunks: --max-workers (4)
    # offline chunks send no request: plan_ahead waited for them; judged before any flow exists
    ahead_reports = {seq: h.future.result(timeout=30) for seq, h in ahead.head_starts.items()}
    assert sorted(judged) == [f"r{i:04d}" for i in range(20)]

    plan = steps.plan_run(params, prepared=prepared)  # what the flow calls: it takes the plan made ahead
    assert plan is ahead
    tally = score_chunks(plan, PoolExecutor(plan))
    assert plan.head_starts == {}  # each taken by its chunk's task
    assert sorted(judged) == [f"r{i:04d}" for i in range(45)]  # every row once: no chunk was judged again
    assert [p.path for p in tally.parts[:4]] == [ahead_reports[seq].path for seq in range(4)]
    assert tally.done_rows == 45
    assert head_start.abandon(prepared) == 0  # nothing left to abandon once the flow took the plan


def test_the_head_start_returns_once_its_first_request_is_out(
    data: str, tmp_path: Path, fake_openai, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan_ahead returns when the first judge request has gone out, not before (Prefect's import would then take
    the interpreter from the prompts and the client still being built), nor after its answer."""
    from tests import judge_script

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-head-start")
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 1.0
    params = RunParams(
        dataset_uri=data, output_uri=str(tmp_path / "out"), judge="openai", base_url=fake_openai.base_url,
        chunk_size=5, max_retries=0,
    )  # fmt: skip
    prepared = head_start.preflight(params)
    ahead = head_start.plan_ahead(prepared)
    try:
        assert ahead.head_starts
        assert ahead.breaker is not None and ahead.breaker.first_sent.is_set()  # going out as plan_ahead returned
        assert fake_openai.wait_for_requests(1, timeout=5)  # a real request on the wire
        assert not any(h.future.done() for h in ahead.head_starts.values())  # none answered: the wait ends there
    finally:
        assert head_start.abandon(prepared) == 0  # cancelled in flight: nothing judged, nothing kept


@pytest.mark.concurrency  # the SDK's platform headers run uname; the flow runs on the test's Prefect server
def test_a_flow_stopped_before_its_window_keeps_what_the_head_start_judged(
    prefect_harness, data: str, tmp_path: Path, fake_openai, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow took the head start's plan, then stopped before its chunk window began (here: announcing the run
    fails; in the CLI, a Ctrl-C landing there). The head start's calls are cancelled and the rows they judged are
    flushed to the row cache and reported, as when the window itself is interrupted. Before, nothing aborted them:
    they went on judging, their rows stayed unflushed, and the CLI said "0 rows judged so far are cached"
    (test_interrupts[sigint], 1 clean-clone run in 4)."""
    from recall_tasks.pipeline import flow
    from tests import judge_script

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-head-start")
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.2
    params = RunParams(
        dataset_uri=data, output_uri=str(tmp_path / "out"), judge="openai", base_url=fake_openai.base_url,
        chunk_size=5, max_concurrency=4, max_retries=0,
    )  # fmt: skip
    prepared = head_start.preflight(params)
    ahead = head_start.plan_ahead(prepared)
    assert fake_openai.wait_for_requests(9, timeout=30)  # the first 4 answered, the next 4 or more in flight

    def broken(*args: object) -> None:
        raise RuntimeError("announce failed")

    kept: list[int] = []
    observer = SimpleNamespace(
        progress=lambda done, total: None, rows=lambda seq, n: None, aborted=kept.append, waiting=print
    )
    monkeypatch.setattr(flow, "announce", broken)
    with flow.handing_off(prepared, observer), pytest.raises(RuntimeError, match="announce failed"):
        flow.recall_benchmark(params)
    assert ahead.scope.cancelled  # the head start's calls were cancelled
    sent = len(fake_openai.requests)
    assert len(kept) == 1 and 4 <= kept[0] < sent <= 45
    assert ahead.cache is not None and ahead.cache.stored == kept[0]  # flushed: a rerun finds them
    assert head_start.abandon(prepared) == 0  # the flow had taken the plan: nothing left for the CLI
    assert not fake_openai.wait_for_requests(sent + 1, timeout=1.0)  # and nothing more is sent
