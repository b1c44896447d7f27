"""The run object: what a benchmark run is made of, split by who owns it and how long it lives.

- :class:`RunSpec` (frozen): the run's configuration and identity, decided by ``steps.plan_run`` and never changed.
- :class:`RunResources` (a context manager): what the run opens and must close (judge, row cache, budget, circuit
  breaker), the cancel scope and shared requests of its judge calls; each closed exactly once, however it ends.
- :class:`ChunkWindow`: the chunk loop's own state (blocks parked for their tasks, layout, observer).
- :class:`RunPlan` holds the three; its read-only properties are what the steps read (``plan.params``,
  ``plan.cache``...), never a place to store anything.

Who watches a run from outside (the CLI's progress bar, its interrupt message) is a :class:`RunObserver`, an
ordinary argument of ``conduct.conduct`` (and so of ``flow.run_benchmark``); who may cancel it passes the run's
:class:`~recall_tasks._sync.CancelScope` the same way. No module-level registry: a process running two runs at
once (tests, a library user) never mixes their plans, listeners or cancellations.
"""

from __future__ import annotations

import datetime as dt
import logging
import operator
import secrets as pysecrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, runtime_checkable

from recall_tasks._sync import CancelScope
from recall_tasks.config import RunParams
from recall_tasks.fleet.guards import Budget, CircuitBreaker
from recall_tasks.io.blocks import Layout, RowBlock
from recall_tasks.io.datasets import Dataset
from recall_tasks.io.results import ResultStore
from recall_tasks.io.retrieval import RetrievalResults, Retriever, with_retrieved
from recall_tasks.io.traces import TraceContext
from recall_tasks.judges.base import JudgeResponse
from recall_tasks.metrics.base import Metric
from recall_tasks.pipeline.components import release_judge
from recall_tasks.pipeline.shared import SharedRequests

if TYPE_CHECKING:
    from pathlib import Path

    from recall_tasks.pipeline.canary import Canary

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class ChunkReport:
    """What a chunk task returns: small, so Prefect never holds row data.

    ``not_judged``: rows the budget or the circuit breaker kept from the judge.
    """

    seq: int
    rows: int
    errors: int
    scored: int
    path: str
    not_judged: int | None = None
    pid: int | None = None  # the process that scored the chunk (another one with --task-runner processes|dask)
    stopped: str | None = None  # a worker process's circuit breaker reason, carried back to the flow's run
    budget: str | None = None  # a worker process's exhausted --max-requests or --max-cost-usd, carried back likewise
    substituted: int = 0  # rows a reply from another model judged (never cached: judged again next time)


@dataclass(frozen=True)
class RunSpec:
    """A planned run's configuration and identity: set once by ``steps.plan_run`` (or a worker's plan)."""

    params: RunParams
    run_id: str
    run_key: str
    resumed: bool
    dataset: Dataset
    store: ResultStore
    started_at: dt.datetime
    started_clock: float
    config_hash: str = ""
    segment_columns: tuple[str, ...] = ()
    retriever: Retriever | None = None
    retrieval: RetrievalResults | None = None
    trace: TraceContext | None = None  # contexts from agent traces (--context-from / --context-extractor)
    canary: Canary | None = None  # --canary: judged at the commit (pipeline/canary.py)
    notes: tuple[str, ...] = ()  # the checks' notes (told to the run's observer)
    #: this attempt of the run (a resumed run keeps its run id, not this): worker processes key their state by it
    attempt: str = field(default_factory=lambda: pysecrets.token_hex(8))

    def prepare_block(self, block: RowBlock) -> RowBlock:
        """Fill the block's contexts from the run-time retriever, the retrieval results or the traces, if configured."""
        if self.trace is not None:
            return self.trace.apply(block)
        if self.retrieval is not None:
            return self.retrieval.apply(block)
        if self.retriever is not None:
            return with_retrieved(block, self.retriever)
        return block


class RunCache(Protocol):
    """The row cache as the run uses it (``io.cache.RowVerdictCache``, or ``batch.finish.HideCollected``)."""

    @property
    def stored(self) -> int: ...

    @property
    def spilled(self) -> int: ...

    @property
    def spill(self) -> Path: ...

    def get_many(self, keys: list[str]) -> dict[str, JudgeResponse]: ...

    def put_many(self, entries: dict[str, JudgeResponse], *, flush: bool = True) -> bool: ...

    def flush(self) -> None: ...

    def owed(self, key: str, response: JudgeResponse) -> bool: ...

    def close(self) -> None: ...


class RunResources:
    """What a run opens and must close: the metric's judge, the row cache, the budget (a worker's fleet budget
    holds an API client), the circuit breaker; with the run's cancel scope and shared requests.

    Closing is owned here and nowhere else: :meth:`close` (or leaving the ``with`` block) closes each resource
    exactly once, in the order cache, budget, judge, whatever happened before (a failure closing one never skips
    the next: it is logged). :meth:`close_cache` closes the row cache early (the commit compacts it before writing
    the tables), after which :meth:`close` leaves it. The circuit breaker holds nothing to close; it lives as long
    as the resources. :meth:`serving` gives the batch finish its view (another judge and cache in use, the same
    ones closed).
    """

    def __init__(
        self,
        metric: Metric,
        cache: RunCache | None = None,
        budget: Budget | None = None,
        breaker: CircuitBreaker | None = None,
        *,
        close_budget: Callable[[], None] | None = None,
        scope: CancelScope | None = None,
    ) -> None:
        self.metric = metric
        self.cache = cache
        self.budget = budget
        self.breaker = breaker
        self.scope = scope if scope is not None else CancelScope()  # every judge call of the run: abort cancels them
        self.shared = SharedRequests()  # requests in flight by row-cache key
        #: the run's budget counters in Prefect by kind (processes/dask with --max-requests / --max-cost-usd)
        self.budget_counters: dict[str, str] = {}
        self._closers = _closers_of(metric, cache, close_budget)
        self._life = _Lifecycle()  # shared with the views of :meth:`serving`

    def serving(self, metric: Metric, cache: RunCache | None) -> RunResources:
        """The same resources with ``metric`` and ``cache`` in use (``batch.finish``): closing either closes the
        originals, once."""
        view = RunResources.__new__(RunResources)
        view.__dict__.update(self.__dict__)
        view.metric, view.cache = metric, cache
        return view

    @property
    def closed(self) -> bool:
        """Every resource closed (the run is over)."""
        return set(self._closers) <= self._life.closed

    def keep_once(self) -> bool:
        """True the first time only: an aborted run's judged rows are kept and counted once (``steps.keep_judged``)."""
        with self._life.lock:
            first, self._life.kept = not self._life.kept, True
            return first

    def close_cache(self) -> None:
        """Close (flush and compact) the row cache now; its errors are the caller's (the commit's)."""
        self._close_one("cache", log_errors=False)

    def close(self) -> None:
        """Close each resource not closed yet, once; errors are logged (a run's own error matters more)."""
        for name in list(self._closers):
            self._close_one(name, log_errors=True)

    def _close_one(self, name: str, *, log_errors: bool) -> None:
        with self._life.lock:
            closer = self._closers.get(name)
            if closer is None or name in self._life.closed:
                return
            self._life.closed.add(name)
        try:
            closer()
        except Exception as exc:
            if not log_errors:
                raise
            log.warning("could not close the run's %s: %s", name, exc)

    def __enter__(self) -> RunResources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Lifecycle:
    """What a run's resources have been through: closed (by name), kept after an abort."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed: set[str] = set()
        self.kept = False


def _closers_of(
    metric: Metric, cache: RunCache | None, close_budget: Callable[[], None] | None
) -> dict[str, Callable[[], None]]:
    """How each resource closes: the cache compacts, a worker's fleet budget closes its API client (``workers``
    passes how), the judge its HTTP client (``components.release_judge``)."""
    closers: dict[str, Callable[[], None]] = {}
    if cache is not None:
        closers["cache"] = cache.close
    if close_budget is not None:
        closers["budget"] = close_budget
    judge = metric.judge
    closers["judge"] = lambda: release_judge(judge)
    return closers


@dataclass
class ChunkWindow:
    """The chunk loop's state: blocks parked until their task settles, the layout.

    ``pending``: a task's rows are not its parameters (Prefect keeps those referenced after the run), so the
    loop parks each block here by sequence number until its task settles.
    """

    pending: dict[int, RowBlock] = field(default_factory=dict)
    layout: Layout | None = None  # the run's chunks (identical rows in one chunk): see steps.blocks()
    #: told the rows of the chunks scored in this process as they settle (the CLI's bar); set by whoever runs the
    #: plan (``conduct.conduct``), None: nobody watches
    observer: RunObserver | None = None


class _Of(Generic[T]):
    """A read-only view of a field of one part of the plan: ``plan.params`` is ``plan.spec.params``."""

    def __init__(self, part: str, field: str | None = None) -> None:
        self.part, self.field = part, field
        self._get: Callable[[object], T] | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self._get = operator.attrgetter(f"{self.part}.{self.field or name}")

    def __get__(self, plan: object, owner: type | None = None) -> T:
        assert self._get is not None  # set when the class is created
        return self._get(plan)


@dataclass(frozen=True, eq=False)
class RunPlan:
    """A planned run: its :class:`RunSpec`, its :class:`RunResources` and its :class:`ChunkWindow`.

    The properties are read-only views of the three parts, for the steps that only read them.
    """

    spec: RunSpec
    resources: RunResources
    window: ChunkWindow = field(default_factory=ChunkWindow)

    # -- the spec
    params = _Of[RunParams]("spec")
    run_id = _Of[str]("spec")
    run_key = _Of[str]("spec")
    resumed = _Of[bool]("spec")
    dataset = _Of[Dataset]("spec")
    store = _Of[ResultStore]("spec")
    started_at = _Of[dt.datetime]("spec")
    started_clock = _Of[float]("spec")
    config_hash = _Of[str]("spec")
    segment_columns = _Of["tuple[str, ...]"]("spec")
    retriever = _Of["Retriever | None"]("spec")
    retrieval = _Of["RetrievalResults | None"]("spec")
    trace = _Of["TraceContext | None"]("spec")
    canary = _Of["Canary | None"]("spec")
    notes = _Of["tuple[str, ...]"]("spec")
    attempt = _Of[str]("spec")
    prepare_block = _Of[Callable[[RowBlock], RowBlock]]("spec")
    # -- the resources
    metric = _Of[Metric]("resources")
    cache = _Of["RunCache | None"]("resources")
    budget = _Of["Budget | None"]("resources")
    breaker = _Of["CircuitBreaker | None"]("resources")
    scope = _Of[CancelScope]("resources")
    shared = _Of[SharedRequests]("resources")
    budget_counters = _Of["dict[str, str]"]("resources")
    # -- the window
    pending_blocks = _Of["dict[int, RowBlock]"]("window", "pending")


@runtime_checkable  # a parameter of ``flow.watched_benchmark``: Prefect's parameter schema checks it by isinstance
class RunObserver(Protocol):
    """Who watches a run from outside (the CLI's progress bar and interrupt message)."""

    def progress(self, done: int, total: int) -> None:
        """Rows settled so far, after every chunk."""
        ...

    def rows(self, seq: int, n: int | None) -> None:
        """``n`` more rows of chunk ``seq`` settled while it is scored in this process (``pipeline/progress.py``);
        ``n`` None: forget that chunk's count (an attempt to score it starts; it settled, :meth:`progress` next)."""
        ...

    def aborted(self, rows_cached: int) -> None:
        """The run was aborted; ``rows_cached`` rows it judged are in the row cache (a rerun resumes with them)."""
        ...

    def waiting(self, message: str) -> None:
        """``--wait-for-lock``: this attempt waits for another attempt of the same run (said once)."""
        ...

    def note(self, message: str) -> None:
        """A note of the run's checks (a retrieval file that misses rows, an endpoint without ``/models``)."""
        ...


class NoObserver:
    """Nobody watching: deployment runs, tests, library calls."""

    def progress(self, done: int, total: int) -> None:
        pass

    def rows(self, seq: int, n: int | None) -> None:
        pass

    def waiting(self, message: str) -> None:
        log.warning("%s", message)

    def note(self, message: str) -> None:
        log.warning("%s", message)

    def aborted(self, rows_cached: int) -> None:
        pass


NO_OBSERVER: RunObserver = NoObserver()
