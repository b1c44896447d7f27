"""The threads runner's spend ledger (``fleet/ledger.py``): what a resumed attempt starts its budget from."""

from __future__ import annotations

import logging
import threading

import pytest

from recall_tasks.fleet import ledger
from recall_tasks.fleet.guards import Budget
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig


@pytest.mark.concurrency
def test_chunks_ending_together_each_record_whole_and_the_largest_figure_stays(tmp_path, caplog):
    """Chunk threads end together and each writes the attempt's file: every write lands whole (one temporary name
    for all of them made one thread's rename take the other's file away, a warning and a lost figure, seen in a
    clean-clone run), and the file ends with the largest figure the budget reached."""
    store = ResultStore(str(tmp_path / "out"), StorageConfig(), "delta")  # type: ignore[arg-type]
    budget = Budget(max_requests=10_000)
    counting = threading.Lock()
    start = threading.Barrier(8)

    def chunk_thread() -> None:
        start.wait()
        for _ in range(40):
            with counting:
                budget.requests += 1  # a request reserved, then the chunk's record, as _score_chunk does
            ledger.record(store, "run-key", "attempt-1", budget)

    caplog.set_level(logging.WARNING, logger="recall_tasks.fleet.ledger")
    threads = [threading.Thread(target=chunk_thread) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.getMessage() for r in caplog.records] == []
    assert ledger.spent(store, "run-key") == (8 * 40, 0.0)
    ledger.clear(store, "run-key")
    assert ledger.spent(store, "run-key") == (0, 0.0)


def test_a_run_without_a_budget_writes_no_ledger(tmp_path):
    store = ResultStore(str(tmp_path / "out"), StorageConfig(), "delta")  # type: ignore[arg-type]
    ledger.record(store, "run-key", "attempt-1", Budget())
    assert not (tmp_path / "out" / "_pending").exists()
