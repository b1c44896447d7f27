"""The chunk loop, without Prefect: a bounded window of chunks in flight, abort on any error.

The flow hands :func:`score_chunks` a :class:`ChunkExecutor`; the Prefect adapter (``pipeline/flow.py``) runs
each chunk as a Prefect task, a test can run them on a thread pool. What the loop decides:

- **Every chunk through its task**: there is no chunk cache. A rerun's rows are served by the row cache
  (``io/cache.py``, the one verdict store) inside the chunk's task, so only rows it cannot serve reach the judge.
- **Bounded memory**: a task's parameters stay in memory until it finishes, so at most ``max_workers`` chunks are
  in flight (not one ``.map`` over the dataset); the rows themselves wait in the window's state
  (``plan.window.pending``, :class:`~recall_tasks.pipeline.run.ChunkWindow`).
- **Abort**: on any exception (an interrupt, a configuration error) the run's judge calls are cancelled, the
  chunks in flight get :data:`ABORT_WAIT_S` to settle, the row cache is flushed (the observer is told how many
  rows it holds), and the exception goes on.

The loop closes nothing: the run's resources are closed once by their owner (``conduct.conduct``, through
:class:`~recall_tasks.pipeline.run.RunResources`), after the commit that still uses the judge and the cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from recall_tasks import _heap
from recall_tasks.io.results import ChunkPart
from recall_tasks.pipeline import steps
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

    def report(self) -> ChunkReport:
        """The settled chunk's report; raises the chunk's error."""
        ...


class ChunkExecutor(Protocol):
    """Runs chunks; the Prefect adapter implements it with tasks."""

    def submit(self, seq: int, key: str) -> ChunkHandle:
        """Score the chunk parked in ``plan.window.pending[seq]``."""
        ...

    def progress(self, done_rows: int, total_rows: int, *, final: bool) -> None:
        """Rows settled so far (called after every chunk, and once with ``final`` at the end)."""
        ...


@dataclass
class ChunkTally:
    """What the loop settled: the result parts to commit and the rows they hold."""

    parts: list[ChunkPart] = field(default_factory=list)
    done_rows: int = 0


def score_chunks(plan: RunPlan, executor: ChunkExecutor, observer: RunObserver = NO_OBSERVER) -> ChunkTally:
    """Score every chunk of the dataset through ``executor``; see the module docstring for the rules."""
    params = plan.params
    total = plan.dataset.num_rows
    tally = ChunkTally()
    parked = plan.window.pending
    window: deque[tuple[ChunkHandle, int, str]] = deque()
    observer.progress(0, total)  # the total is known from the start: a bar shows 0/N, not 0/?

    def record(seq: int, report: ChunkReport) -> None:
        parked.pop(seq, None)
        tally.parts.append(ChunkPart(report.path))
        tally.done_rows += report.rows
        observer.rows(seq, None)  # its rows counted as they settled are in done_rows from now on
        observer.progress(tally.done_rows, total)
        executor.progress(tally.done_rows, total, final=False)
        _heap.trim_heap(_heap.TRIM_EVERY_S)  # the settled chunk's pages back to the system (recall_tasks/_heap.py)

    def settle() -> None:
        handle, seq, key = window.popleft()
        while not handle.wait(SIGNAL_POLL_S):
            pass
        record(seq, handle.report())

    try:
        for seq, raw in enumerate(steps.blocks(plan)):
            block = plan.prepare_block(raw)
            key = steps.chunk_key(plan, block)
            parked[seq] = block
            window.append((executor.submit(seq, key), seq, key))
            while len(window) >= params.max_workers:
                settle()
        while window:
            settle()
        executor.progress(tally.done_rows, total, final=True)
    except BaseException:
        steps.abort(plan)
        for handle, _, _ in window:
            handle.wait(ABORT_WAIT_S)  # cancelled chunks settle in milliseconds; a retry delay is not waited
        steps.keep_judged(plan, observer)
        raise
    return tally
