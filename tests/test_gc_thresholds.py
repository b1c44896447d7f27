"""A run's garbage collection thresholds (``recall_tasks/_gc.py``): raised while a run judges (in process, in a
worker process's chunk, for the CLI's whole process), the process's own given back when the last run ends, even
a failed one; and what they are for: a run of a few thousand rows makes no full collection."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recall_tasks import _gc, evaluate
from recall_tasks.config import RunParams
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.pipeline import conduct, steps, workers
from tests.test_pipeline import make_rows, write_parquet

MINE = (701, 11, 12)  # a process's own thresholds, distinct from the defaults and from the run's
RAISED = (20_000, 11, 100)
DEFAULTS = (700, 10, 10)  # CPython's  # MINE under a run: each at least RUN_THRESHOLDS' value


@pytest.fixture
def own_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(*MINE)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_a_run_raises_each_threshold_to_at_least_the_runs_and_keeps_collection_off_off() -> None:
    assert _gc.raised((700, 10, 10)) == _gc.RUN_THRESHOLDS
    assert _gc.raised((50_000, 5, 1_000)) == (50_000, 10, 1_000)  # a user's higher ones stay
    assert _gc.raised((0, 10, 10)) == (0, 10, 10)  # gc.set_threshold(0): collection off stays off


def record_during_chunks(monkeypatch: pytest.MonkeyPatch, seen: list[tuple[int, ...]], fail: bool = False) -> None:
    real = conduct.score_chunks

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold())
        if fail:
            raise RuntimeError("a chunk failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(conduct, "score_chunks", watched)


def test_a_run_judges_with_the_run_thresholds_and_gives_the_process_its_own_back(
    own_thresholds: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[int, ...]] = []
    record_during_chunks(monkeypatch, seen)
    result = evaluate(make_rows(12), output=tmp_path / "out")
    assert result.results.num_rows == 12
    assert seen == [RAISED]
    assert gc.get_threshold() == MINE


def test_a_failed_run_gives_them_back_too(
    own_thresholds: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[int, ...]] = []
    record_during_chunks(monkeypatch, seen, fail=True)
    with pytest.raises(RuntimeError, match="a chunk failed"):
        evaluate(make_rows(12), output=tmp_path / "out")
    assert seen == [RAISED]
    assert gc.get_threshold() == MINE


@pytest.mark.concurrency
def test_overlapping_runs_restore_once_the_last_one_leaves(own_thresholds: None) -> None:
    inside, leave_first, first_left = threading.Barrier(2), threading.Event(), threading.Event()
    during: list[tuple[int, ...]] = []

    def first() -> None:
        with _gc.run_thresholds():
            inside.wait(10)
            leave_first.wait(10)
        first_left.set()

    thread = threading.Thread(target=first)
    thread.start()
    with _gc.run_thresholds():
        inside.wait(10)
        leave_first.set()
        assert first_left.wait(10)
        during.append(gc.get_threshold())  # the first run left; this one still runs with the raised thresholds
    thread.join(10)
    assert during == [RAISED]
    assert gc.get_threshold() == MINE


def test_a_worker_process_scores_its_chunk_with_them(
    own_thresholds: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(14), row_group_size=7)
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), chunk_size=7, task_runner="processes")
    plan = steps.plan_run(params)
    seen: list[tuple[int, ...]] = []
    real = workers.steps.score_chunk

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(workers.steps, "score_chunk", watched)
    try:
        block = next(iter_blocks(plan.dataset, 7))
        report = workers.score_spec(workers.chunk_spec(plan, 0, block, steps.chunk_key(plan, block)))
        assert report.rows == 7
    finally:
        steps.release(plan)
    assert seen == [RAISED]
    assert gc.get_threshold() == MINE


def test_the_cli_process_keeps_them_raised(own_thresholds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from recall_tasks.cli.runtime import freeze_heap

    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test process's heap stays collectable
    freeze_heap()
    assert gc.get_threshold() == RAISED and gc.isenabled()


@pytest.mark.parametrize("extra", [["--dry-run"], ["--threshold", "-1"]])
def test_a_run_command_that_stops_before_judging_leaves_the_collector_on(extra: list[str], tmp_path: Path) -> None:
    """``run`` pauses the collector while it starts; called in process (CliRunner, a notebook), a dry run or a
    refused option gave the process back with it off (a later test of this process then saw no collection)."""
    from typer.testing import CliRunner

    from recall_tasks.cli import app as cli

    data = write_parquet(tmp_path / "eval.parquet", make_rows(3))
    assert gc.isenabled()
    done = CliRunner().invoke(cli.app, ["run", data, "-o", str(tmp_path / "out"), *extra])
    assert done.exit_code == (0 if extra == ["--dry-run"] else 2), done.output
    assert gc.isenabled()


def test_a_run_of_thousands_of_rows_makes_no_full_collection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With CPython's defaults this run makes full collections (4 when written, counted below); the
    run's thresholds leave none. Each full collection walks every object of the process."""
    full: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    rows = make_rows(5000)
    before = gc.get_threshold()  # an in-process CLI test may have raised this process's for good
    assert gc.isenabled()  # and none left it off (the test above)
    gc.set_threshold(*DEFAULTS)
    gc.collect()
    gc.callbacks.append(count)
    try:
        monkeypatch.setattr(_gc, "RUN_THRESHOLDS", DEFAULTS)
        evaluate(rows, output=tmp_path / "default")
        with_defaults = len(full)
        monkeypatch.undo()
        full.clear()
        evaluate(rows, output=tmp_path / "run")
        with_run_thresholds = len(full)
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*before)
    assert with_defaults >= 2, with_defaults
    assert with_run_thresholds == 0
