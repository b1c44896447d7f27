"""The chunk loop, without Prefect: cache pre-check, a bounded window of chunks in flight, abort on any error.

The flow hands :func:`score_chunks` a :class:`ChunkExecutor`; the Prefect adapter (``pipeline/flow.py``) runs
each chunk as a cached Prefect task, a test can run them on a thread pool. What the loop decides:

- **Served without a task** (:func:`served_from_cache`): a live chunk-cache record for the chunk's content key
  whose rows all succeeded and whose result file still exists. A rerun of an unchanged dataset then costs no
  task run per chunk.
- **Judged again**: a record with failures or a pruned file goes through its task with the cache refreshed; the
  good rows come from the row cache, so only the failures reach the judge.
- **Bounded memory**: a task's parameters stay in memory until it finishes, so at most ``max_workers`` chunks are
  in flight (not one ``.map`` over the dataset); the rows themselves wait in the window's state
  (``plan.window.pending``, :class:`~recall_tasks.pipeline.run.ChunkWindow`).
- **Abort**: on any exception (an interrupt, a configuration error) the run's judge calls are cancelled, the
  chunks in flight get :data:`ABORT_WAIT_S` to settle, the row cache is flushed (the observer is told how many
  rows it holds), and the exception goes on.

The loop closes nothing: the run's resources are closed once by their owner (``flow.run_benchmark``, through
:class:`~recall_tasks.pipeline.run.RunResources`), after the commit that still uses the judge and the cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from recall_tasks import _heap
from recall_tasks.io.blocks import RowBlock
from recall_tasks.io.results import ChunkPart
from recall_tasks.pipeline import head_start, steps
from recall_tasks.pipeline.run import NO_OBSERVER, ChunkReport, RunObserver, RunPlan
from recall_tasks.pipeline.steps import ABORT_WAIT_S

#: While waiting for a chunk, the flow's thread wakes this often: Python runs a signal handler only when the
#: main thread executes bytecode, and the kernel may deliver SIGINT/SIGTERM to a chunk thread while this one
#: sleeps in a lock (a plain blocking wait held Ctrl-C until the chunk finished).
SIGNAL_POLL_S = 0.05


class ChunkHandle(Protocol):
    """A chunk submitted for scoring."""

    def wait(self, timeout: float) -> bool:
        """True once the chunk has settled (finished, failed or cancelled), waiting at most ``timeout`` s."""
        ...

    def report(self) -> tuple[ChunkReport, bool]:
        """The settled chunk's report, and whether it came from the chunk cache; raises the chunk's error."""
        ...


class ChunkExecutor(Protocol):
    """Runs chunks; the Prefect adapter implements it with (cached) tasks."""

    def cached(self, key: str) -> ChunkReport | None:
        """The chunk cache's live record for ``key``, read without running anything (None: not cached)."""
        ...

    def submit(self, seq: int, key: str, *, refresh: bool) -> ChunkHandle:
        """Score the chunk parked in ``plan.window.pending[seq]``; ``refresh`` overwrites its cache record."""
        ...

    def progress(self, done_rows: int, total_rows: int, *, final: bool) -> None:
        """Rows settled so far (called after every chunk, and once with ``final`` at the end)."""
        ...


@dataclass
class ChunkTally:
    """What the loop settled: the result parts to commit and how many chunks the cache served whole."""

    parts: list[ChunkPart] = field(default_factory=list)
    done_rows: int = 0
    served_from_cache: int = 0


def is_reused(plan: RunPlan, report: ChunkReport) -> bool:
    """A report whose result file belongs to an earlier run (its file name is not this run's id)."""
    return not report.path.endswith(f"/{plan.run_id}.parquet")


def served_from_cache(plan: RunPlan, report: ChunkReport | None, block: RowBlock) -> bool:
    """Whether a cached report stands for the block as is: every row succeeded and its file still exists."""
    return (
        report is not None and report.reusable and report.rows == len(block.row_ids) and plan.store.exists(report.path)
    )


def needs_rescore(plan: RunPlan, report: ChunkReport, from_cache: bool) -> bool:
    """A report the chunk cache served with failures, or whose earlier run's file was pruned: judge it again."""
    if not from_cache:
        return False
    return not report.reusable or (is_reused(plan, report) and not plan.store.exists(report.path))


def score_chunks(plan: RunPlan, executor: ChunkExecutor, observer: RunObserver = NO_OBSERVER) -> ChunkTally:
    """Score every chunk of the dataset through ``executor``; see the module docstring for the rules."""
    params = plan.params
    total = plan.dataset.num_rows
    tally = ChunkTally()
    parked = plan.window.pending
    window: deque[tuple[ChunkHandle, int, str]] = deque()
    observer.progress(0, total)  # the total is known from the start: a bar shows 0/N, not 0/?

    def record(seq: int, report: ChunkReport, reused: bool) -> None:
        parked.pop(seq, None)
        tally.parts.append(ChunkPart(report.path, reused=reused))
        tally.done_rows += report.rows
        observer.rows(seq, None)  # its rows counted as they settled are in done_rows from now on
        observer.progress(tally.done_rows, total)
        executor.progress(tally.done_rows, total, final=False)
        _heap.trim_heap(_heap.TRIM_EVERY_S)  # the settled chunk's pages back to the system (recall_tasks/_heap.py)

    def settle() -> None:
        handle, seq, key = window.popleft()
        while not handle.wait(SIGNAL_POLL_S):
            pass
        report, from_cache = handle.report()
        reused = from_cache and is_reused(plan, report)
        if needs_rescore(plan, report, from_cache):
            retry = executor.submit(seq, key, refresh=True)
            while not retry.wait(SIGNAL_POLL_S):
                pass
            report, _ = retry.report()
            reused = False
        record(seq, report, reused)

    try:
        for seq, raw in enumerate(steps.blocks(plan)):
            block = plan.prepare_block(raw)
            key = steps.chunk_key(plan, block)
            cached = None if not params.cache or params.refresh_cache else executor.cached(key)
            if cached is not None and served_from_cache(plan, cached, block):
                head_start.drop_head_start(plan, seq, cached)
                tally.served_from_cache += 1
                record(seq, cached, reused=is_reused(plan, cached))
                continue
            parked[seq] = block
            window.append((executor.submit(seq, key, refresh=cached is not None), seq, key))
            while len(window) >= params.max_workers:
                settle()
        while window:
            settle()
        executor.progress(tally.done_rows, total, final=True)
    except BaseException:
        steps.abort(plan)
        for handle, _, _ in window:
            handle.wait(ABORT_WAIT_S)  # cancelled chunks settle in milliseconds; a retry delay is not waited
        head_start.settle_all(plan)
        steps.keep_judged(plan, observer)
        raise
    return tally
