"""The run object (``pipeline/run.py``): resources closed exactly once, and the CLI's preparation handed to the flow
through ``flow.HANDOFF`` (one ContextVar around the call), never through a module global."""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from recall_tasks.config import RunParams
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.pipeline import flow, head_start, run, steps
from recall_tasks.pipeline.batch import finish
from tests.test_pipeline import make_rows, write_parquet


class Counter:
    """Counts what is closed, by name."""

    def __init__(self) -> None:
        self.closed: dict[str, int] = {}

    def add(self, name: str) -> None:
        self.closed[name] = self.closed.get(name, 0) + 1


class Watch:
    """A RunObserver that records what it is told."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int]] = []
        self.aborted_with: list[int] = []
        self.rows_settled: list[tuple[int, int | None]] = []

    def progress(self, done: int, total: int) -> None:
        self.done.append((done, total))

    def rows(self, seq: int, n: int | None) -> None:
        self.rows_settled.append((seq, n))

    def aborted(self, rows_cached: int) -> None:
        self.aborted_with.append(rows_cached)

    def waiting(self, message: str) -> None:
        raise AssertionError(f"no other attempt holds the run: {message}")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Every row cache close and every judge release, counted (the real ones still run)."""
    counter = Counter()
    real_close = RowVerdictCache.close
    real_release = run.release_judge

    def close(self: RowVerdictCache) -> None:
        counter.add("cache")
        real_close(self)

    def release(judge: Any) -> None:
        counter.add("judge")
        real_release(judge)

    monkeypatch.setattr(RowVerdictCache, "close", close)
    monkeypatch.setattr(run, "release_judge", release)
    return counter


@pytest.fixture
def data(tmp_path: Path) -> str:
    return write_parquet(tmp_path / "data" / "d.parquet", make_rows(30))


def lexical(data: str, out: Path, **kw: Any) -> RunParams:
    return RunParams(dataset_uri=data, output_uri=str(out), judge="lexical", chunk_size=5, max_workers=2, **kw)


def test_the_resources_close_each_once_however_often_they_are_asked(data: str, tmp_path: Path, counted) -> None:
    plan = steps.plan_run(lexical(data, tmp_path / "out"))
    budget = Counter()
    resources = run.RunResources(
        plan.metric, plan.cache, plan.budget, plan.breaker, close_budget=lambda: budget.add("b")
    )
    view = resources.serving(plan.metric, plan.cache)  # the batch finish's view closes the same ones
    with resources:
        resources.close_cache()  # the commit closes the cache early
        view.close()
        assert resources.closed and view.closed
        resources.close()
    view.close()
    steps.let_go(plan)
    assert counted.closed == {"cache": 1, "judge": 1} and budget.closed == {"b": 1}


def test_one_close_failing_never_skips_the_others(data: str, tmp_path: Path, counted) -> None:
    plan = steps.plan_run(lexical(data, tmp_path / "out"))

    def broken() -> None:
        raise OSError("budget client gone")

    resources = run.RunResources(plan.metric, plan.cache, plan.budget, plan.breaker, close_budget=broken)
    resources.close()
    resources.close()
    steps.let_go(plan)
    assert counted.closed == {"cache": 1, "judge": 1} and resources.closed


def test_a_failure_in_the_middle_of_a_run_still_closes_each_once(
    prefect_harness, data: str, tmp_path: Path, counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = steps.score_block
    calls: list[int] = []

    async def third_chunk_fails(metric, block, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("chunk broke mid-run")
        return await real(metric, block, *args, **kwargs)

    monkeypatch.setattr(steps, "score_block", third_chunk_fails)
    watch = Watch()
    with flow.handing_off(None, watch), pytest.raises(ValueError, match="chunk broke mid-run"):
        flow.recall_benchmark(lexical(data, tmp_path / "out", cache=True))
    assert counted.closed == {"cache": 1, "judge": 1}
    assert len(watch.aborted_with) == 1 and watch.aborted_with[0] >= 5  # the rows judged before it: kept, told once
    assert not (tmp_path / "out" / "runs").exists()


def test_a_finished_run_closes_each_once_and_its_observer_sees_the_progress(
    prefect_harness, data: str, tmp_path: Path, counted
) -> None:
    watch = Watch()
    with flow.handing_off(None, watch):
        summary = flow.recall_benchmark(lexical(data, tmp_path / "out"))
    assert summary["status"] == "completed" and summary["rows"] == 30
    assert counted.closed == {"cache": 1, "judge": 1}
    assert watch.done[-1] == (30, 30) and not watch.aborted_with


def test_the_flow_takes_the_plan_the_cli_prepared_through_the_handoff(
    prefect_harness, data: str, tmp_path: Path, counted
) -> None:
    params = lexical(data, tmp_path / "out")
    prepared = head_start.preflight(params)
    ahead = head_start.plan_ahead(prepared)
    assert ahead.head_starts  # judging before the flow exists
    with flow.handing_off(prepared):
        summary = contextvars.copy_context().run(flow.recall_benchmark, params)  # a copied context sees it too
    assert summary["run_id"] == ahead.run_id and prepared.taken and ahead.head_starts == {}
    assert head_start.abandon(prepared) == 0
    assert flow.HANDOFF.get() is None  # reset after the call
    assert counted.closed == {"cache": 1, "judge": 1}


@pytest.mark.parametrize("runner", ["processes", "dask"])
@pytest.mark.concurrency
def test_the_handoff_stays_in_the_flow_process_with_worker_processes(
    prefect_harness, data: str, tmp_path: Path, runner: str
) -> None:
    """Prefect sends the flow object with every process task's context: nothing of the handoff may need pickling
    (the flow's function named ``HANDOFF`` itself at first: ``cannot pickle '_contextvars.ContextVar' object``)."""
    params = lexical(data, tmp_path / "out", task_runner=runner, workers=1)
    prepared = head_start.preflight(params)
    ahead = head_start.plan_ahead(prepared)
    with flow.handing_off(prepared, Watch()):
        cloudpickle.dumps(flow.recall_benchmark)
        summary = flow.recall_benchmark(params)
    assert summary["run_id"] == ahead.run_id and summary["scored"] == 30


def test_an_interrupt_between_taking_the_plan_and_the_chunk_loop_keeps_the_head_start_rows_once(
    prefect_harness, data: str, tmp_path: Path, counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind the flaky ``0 rows judged so far are cached``: the flow had taken the plan made ahead (so the
    CLI's abandon found nothing) and was interrupted before its chunk loop (the only place that kept the rows)."""
    params = lexical(data, tmp_path / "out")
    prepared = head_start.preflight(params)
    ahead = head_start.plan_ahead(prepared)
    for head in ahead.head_starts.values():
        head.future.result(timeout=30)  # the lexical judge is offline: the head start's rows are judged

    def interrupted(plan: Any, logger: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(flow, "announce", interrupted)
    watch = Watch()
    with flow.handing_off(prepared, watch), pytest.raises(KeyboardInterrupt):
        flow.recall_benchmark(params)
    assert prepared.taken and watch.aborted_with == [10]  # 2 chunks of 5 judged ahead: kept and counted once
    assert head_start.abandon(prepared, watch) == 0 and watch.aborted_with == [10]  # the CLI's abandon: nothing left
    assert counted.closed == {"cache": 1, "judge": 1}
    (marker,) = (tmp_path / "out" / "_pending").glob("*.json")  # nothing committed: the rerun resumes
    assert ahead.run_id in marker.read_text()


def test_the_batch_finish_builds_its_view_without_forwarding_by_name() -> None:
    """``HideCollected`` and ``BatchServedJudge`` list what they forward (no ``__getattr__``)."""
    assert "__getattr__" not in vars(finish.HideCollected)
    assert "__getattr__" not in vars(finish.BatchServedJudge)
