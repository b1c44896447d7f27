"""The run object (``pipeline/run.py``): resources closed exactly once, and the observer of a run reaching its flow
as an ordinary argument (``flow.watched_benchmark``), never through a module global."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recall_tasks.config import RunParams
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.pipeline import flow, run, steps
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

    def note(self, message: str) -> None:
        raise AssertionError(f"the checks have nothing to say: {message}")


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
    with pytest.raises(ValueError, match="chunk broke mid-run"):
        flow.watched_benchmark(lexical(data, tmp_path / "out", cache=True), watch, None)
    assert counted.closed == {"cache": 1, "judge": 1}
    assert len(watch.aborted_with) == 1 and watch.aborted_with[0] >= 5  # the rows judged before it: kept, told once
    assert not (tmp_path / "out" / "runs").exists()


def test_a_finished_run_closes_each_once_and_its_observer_sees_the_progress(
    prefect_harness, data: str, tmp_path: Path, counted
) -> None:
    watch = Watch()
    summary = flow.watched_benchmark(lexical(data, tmp_path / "out"), watch, None)
    assert summary["status"] == "completed" and summary["rows"] == 30
    assert counted.closed == {"cache": 1, "judge": 1}
    assert watch.done[-1] == (30, 30) and not watch.aborted_with


@pytest.mark.parametrize("runner", ["processes", "dask"])
@pytest.mark.concurrency
def test_the_observer_and_the_scope_stay_in_the_flow_process_with_worker_processes(
    prefect_harness, data: str, tmp_path: Path, runner: str
) -> None:
    """Prefect sends the flow run's parameters with every process task's context: the observer and the cancel
    scope are pickled there as a process's own (nobody watching, a fresh scope), never as a lock or a bar."""
    import threading

    from recall_tasks._sync import CancelScope
    from recall_tasks.cli.run_flow import _Watch

    params = lexical(data, tmp_path / "out", task_runner=runner, workers=1)
    watch, lock, drawn = _Watch(), threading.RLock(), []  # the CLI's: its bar holds the console's lock
    watch.bar = lambda: drawn.append(lock.acquire(blocking=False))
    summary = flow.watched_benchmark(params, watch, CancelScope())
    assert summary["scored"] == 30 and watch.shown.total == 30 and drawn


def test_an_interrupt_before_the_chunk_loop_keeps_nothing_and_leaves_the_marker(
    prefect_harness, data: str, tmp_path: Path, counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt between the plan and the chunk loop (the run's first log line): aborted and kept once, its
    resources closed once, nothing committed, the marker kept for the rerun."""
    params = lexical(data, tmp_path / "out")

    def interrupted(plan: Any, logger: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(flow, "announce", interrupted)
    watch = Watch()
    with pytest.raises(KeyboardInterrupt):
        flow.watched_benchmark(params, watch, None)
    assert watch.aborted_with == [0]  # kept (nothing judged yet) and told once
    assert counted.closed == {"cache": 1, "judge": 1}
    assert len(list((tmp_path / "out" / "_pending").glob("*.json"))) == 1  # nothing committed: the rerun resumes
    assert not (tmp_path / "out" / "runs").exists()


def test_the_batch_finish_builds_its_view_without_forwarding_by_name() -> None:
    """``HideCollected`` and ``BatchServedJudge`` list what they forward (no ``__getattr__``)."""
    assert "__getattr__" not in vars(finish.HideCollected)
    assert "__getattr__" not in vars(finish.BatchServedJudge)
