"""The spend ledger (``fleet/ledger.py``): what a resumed attempt starts its budget from, held on the store before
each attempt is sent, in blocks."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

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


# -- reserved before it is sent, in blocks --------------------------------------------------------------------------


def _attempts(budget: Budget, n: int, on_sent: Any) -> Any:
    async def one() -> None:
        call = budget.call(True)
        assert await budget.reserve(call)
        call.arm(0.001)
        await call.reserve_attempt()
        on_sent()  # the attempt goes out now
        await asyncio.sleep(0.001)
        call.settle(0.0005)
        budget.release(1, 0.0005, call)

    async def all_of() -> None:
        await asyncio.gather(*(one() for _ in range(n)))

    return all_of()


def test_every_attempt_is_held_on_the_store_before_it_is_sent_in_blocks_of_a_twentieth(tmp_path):
    """64 attempts in flight under --max-requests 100 and --max-cost-usd 1: when each goes out, the attempt's file
    already says at least what was sent (a SIGKILL then loses nothing to a rerun), in about 20 writes per cap."""
    store = ResultStore(str(tmp_path / "out"), StorageConfig(), "delta")  # type: ignore[arg-type]
    budget = Budget(max_requests=100, max_cost_usd=1.0, max_in_flight=64)
    held = ledger.Ledger(store, "run-key", "attempt-1", budget)
    budget.ledger = held
    sent: list[tuple[int, tuple[int, float]]] = []

    def on_sent() -> None:
        sent.append((len(sent) + 1, ledger.spent(store, "run-key")))

    asyncio.run(_attempts(budget, 100, on_sent))
    assert len(sent) == 100 and all(on_store[0] >= n and on_store[1] >= n * 0.001 - 1e-9 for n, on_store in sent)
    assert 2 <= held.writes <= 42, held.writes  # blocks of 5 requests and of 0.05 USD at least, not one a request
    assert ledger.spent(store, "run-key")[0] == 100
    budget.cost_usd = 0.05  # settling writes the exact figure: the rest of the block goes back to a rerun
    held.settle()
    assert ledger.spent(store, "run-key") == (100, pytest.approx(0.05))


def test_a_rerun_counts_what_a_killed_attempt_reserved_and_a_resume_on_another_runner_keeps_it(
    prefect_harness, tmp_path
):
    """The rerun's budget starts from the killed attempt's block; its counters on worker processes start there too,
    and a threads attempt after an attempt on worker processes starts from the counters."""
    from recall_tasks.config import RunParams
    from recall_tasks.fleet import budget as fleet_budget

    store = ResultStore(str(tmp_path / "out"), StorageConfig(), "delta")  # type: ignore[arg-type]
    budget = Budget(max_requests=40)
    budget.ledger = ledger.Ledger(store, "run-key", "attempt-1", budget)
    asyncio.run(_attempts(budget, 7, lambda: None))  # then killed: nothing settled
    reserved, _ = ledger.spent(store, "run-key")
    assert 7 <= reserved <= 7 + 2  # what was sent, and at most a block (2 requests) written ahead
    params = RunParams(dataset_uri="d.parquet", task_runner="processes", max_requests=40)
    names = fleet_budget.create_counters(params, "run-runner", ledger.spent(store, "run-key"))
    assert fleet_budget.counters_spent("run-runner") == (reserved, 0.0)  # processes after threads
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.increment_concurrency_slots(names=[names["requests"]], slots=6, mode="concurrency")
    assert ledger.spent(store, "run-key", "run-runner")[0] == reserved + 6  # threads after processes
    fleet_budget.delete_counters(names.values())
