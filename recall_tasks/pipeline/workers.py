"""Chunks scored in other processes (``--task-runner processes|dask``): a picklable spec, a per-process plan.

With the default ``threads`` runner the chunk task takes the flow's :class:`~recall_tasks.pipeline.run.RunPlan`
in memory (judge, caches, the block parked in its window, the head start). None of that pickles, and a
worker process has no access to the flow's memory. Here the task takes a :class:`ChunkSpec` instead: the run's
parameters and identity, the chunk's sequence number and content key, and the block's coordinates
(file, first row, row count, and the duplicate counts that make its ``~N`` row ids). Rows never travel.

Each worker process builds, once per run attempt, a plan of its own (:func:`checked_out`: dataset footers, judge,
metric, row cache, result store, contexts from retrieval results or traces) without the run's pre-flight and
without ``begin_run``: the run id comes from the spec. It re-reads exactly the block, checks that its content key
is the spec's (the dataset did not change under the run), scores it like the threads path and returns the same
small :class:`~recall_tasks.pipeline.run.ChunkReport`.

Per process and run attempt (the cache's key is :attr:`ChunkSpec.attempt`, so a resumed run, which keeps its run
id, starts with a fresh plan): the judge's concurrency, the circuit breaker (a tripped worker reports its reason
back, and the flow's run takes it), the budget's share. Per chunk: a plan counts the chunks scoring with it
(:func:`checked_out`); what the budget holds goes back when the last of them ends, and a plan evicted from the
cache (:data:`KEEP_PLANS`) is closed only then, never under a chunk in flight. A Dask worker runs several chunks
at once on the process's one event loop, so nothing a chunk ends may close what another uses.
``--rpm``/``--tpm`` hold for the fleet (``fleet/rate.py``), ``--max-requests`` and ``--max-cost-usd`` for the run
(``fleet/budget.py``).
No Prefect here: ``pipeline/flow.py`` wraps :func:`score_spec` in a task.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from recall_tasks import _heap
from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.fleet import rate as fleet
from recall_tasks.fleet.budget import FleetBudget, budget_options
from recall_tasks.fleet.guards import Budget, CircuitBreaker
from recall_tasks.io.blocks import RowBlock, read_block, read_rows
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.io.results import ResultStore
from recall_tasks.io.retrieval import RetrievalResults
from recall_tasks.io.storage import StorageConfig, join_uri
from recall_tasks.metrics import ContextualRecall
from recall_tasks.pipeline import components, steps
from recall_tasks.pipeline.checks import check_context_source
from recall_tasks.pipeline.run import ChunkReport, RunPlan, RunResources, RunSpec

log = logging.getLogger(__name__)

#: Run plans a worker process keeps (one per run id; a long-lived Dask worker serves run after run).
KEEP_PLANS = 4


@dataclass(frozen=True)
class ChunkSpec:
    """What a worker process needs to score one chunk: small and picklable (no rows, no clients, no locks)."""

    params: RunParams
    run_id: str
    run_key: str
    config_hash: str
    dataset_fingerprint: str
    seq: int
    key: str  # the chunk's content key (steps.chunk_key): Prefect's cache key, checked again by the worker
    source: str  # the block's file (DatasetFile.uri)
    first_row: int
    rows: int
    seen: tuple[tuple[str, int], ...] = ()  # identity hash -> its occurrences before the block (``~N`` ids)
    #: the run's budget counters by kind (--max-requests, --max-cost-usd), see fleet/budget.py
    budget_counters: tuple[tuple[str, str], ...] = ()
    attempt: str = ""  # the flow's RunPlan.attempt: worker state is per attempt, a resumed run's is fresh
    #: a grouped chunk (identical rows together, ``io/blocks.plan_layout``): each row's (file, row) and row id
    positions: tuple[tuple[str, int], ...] = ()
    same_as: tuple[int, ...] = ()
    row_ids: tuple[str, ...] = ()


def chunk_spec(plan: RunPlan, seq: int, block: RowBlock, key: str) -> ChunkSpec:
    """The spec of a block the flow has read (and parked): its coordinates, not its rows."""
    if block.positions is not None:
        return ChunkSpec(
            params=plan.params, run_id=plan.run_id, run_key=plan.run_key, config_hash=plan.config_hash,
            dataset_fingerprint=plan.dataset.fingerprint, seq=seq, key=key, source=block.source,
            first_row=block.first_row, rows=len(block.row_ids), positions=tuple(block.positions),
            same_as=tuple(block.same_as or range(len(block.row_ids))),
            row_ids=() if plan.dataset.has_row_id else tuple(block.row_ids),
            budget_counters=tuple(sorted(plan.budget_counters.items())), attempt=plan.attempt,
        )  # fmt: skip
    seen: dict[str, int] = {}
    if not plan.dataset.has_row_id:  # ids are identity hashes; a duplicate's id is ``<hash>~<n>``
        for row_id in block.row_ids:
            base, _, n = row_id.partition("~")
            if n and base not in seen:
                seen[base] = int(n) - 1
    return ChunkSpec(
        params=plan.params, run_id=plan.run_id, run_key=plan.run_key, config_hash=plan.config_hash,
        dataset_fingerprint=plan.dataset.fingerprint, seq=seq, key=key, source=block.source,
        first_row=block.first_row, rows=len(block.row_ids), seen=tuple(sorted(seen.items())),
        budget_counters=tuple(sorted(plan.budget_counters.items())), attempt=plan.attempt,
    )  # fmt: skip


@dataclass(eq=False)
class _Held:
    """A cached plan and the chunks of this process scoring with it now."""

    plan: RunPlan
    users: int = 0
    evicted: bool = False


_plans: OrderedDict[str, _Held] = OrderedDict()  # by run attempt, oldest first
_lock = threading.Lock()


@contextmanager
def checked_out(spec: ChunkSpec) -> Iterator[RunPlan]:
    """This process's plan for the spec's run attempt, held while a chunk scores with it.

    Built on first use, then reused by every chunk of the attempt. Evicting the oldest of more than
    :data:`KEEP_PLANS` marks it; it is closed when its last chunk ends. When the last chunk in flight ends, the
    budget's unspent share goes back to the run's counters.
    """
    key = spec.attempt or spec.run_id
    with _lock:
        held = _plans.get(key)
        if held is None:
            held = _plans[key] = _Held(build_plan(spec))
            while len(_plans) > KEEP_PLANS:
                _, old = _plans.popitem(last=False)
                old.evicted = True
                if old.users == 0:
                    _close(old.plan)
        else:
            _plans.move_to_end(key)
        held.users += 1
    try:
        yield held.plan
    finally:
        with _lock:
            held.users -= 1
            last = held.users == 0
        if last:
            _give_back(held.plan)
            if held.evicted:
                _close(held.plan)


def _give_back(plan: RunPlan) -> None:
    if isinstance(plan.budget, FleetBudget):
        run_sync(plan.budget.give_back())


def build_plan(spec: ChunkSpec) -> RunPlan:
    """A worker's plan from the run's parameters: the flow's plan minus pre-flight, run marker and head start."""
    params = spec.params
    storage = StorageConfig.from_options(params.storage_options)
    dataset = components.open_run_dataset(params, storage, bool(params.retrieval_uri))
    if dataset.fingerprint != spec.dataset_fingerprint:
        raise DatasetError(
            f"the dataset changed after run {spec.run_id} started (its files' fingerprint differs): rerun",
            uri=params.dataset_uri,
        )
    if params.dataset_name:
        dataset.name, dataset.identity = params.dataset_name, f"name:{params.dataset_name}"
    judge = components.make_judge(params)
    metric = components.make_metric(params, judge)
    components.share_limits(params, metric)  # --rpm/--tpm: the fleet's budget, shared with the other workers
    cache = None
    if params.cache:
        cache = RowVerdictCache(
            params.cache_uri or join_uri(params.output_uri, "cache"), storage, read=not params.refresh_cache
        )
        if isinstance(metric, ContextualRecall) and metric.claim_units is not None:
            metric.claim_units.store = cache.claims
        cache.attempt = f"{spec.run_id}/{spec.attempt}"  # as the flow's plan (steps.plan_run)
    run = RunSpec(
        params=params, run_id=spec.run_id, run_key=spec.run_key, resumed=False, dataset=dataset,
        store=ResultStore(params.output_uri, storage, params.format, params.catalog, params.namespace),
        started_at=dt.datetime.now(dt.UTC), started_clock=time.perf_counter(), config_hash=spec.config_hash,
        retrieval=RetrievalResults(params.retrieval_uri, storage) if params.retrieval_uri else None,
        trace=check_context_source(params, dataset),
    )  # fmt: skip
    budget = _budget(spec)
    close_budget = (lambda: run_sync(budget.aclose())) if isinstance(budget, FleetBudget) else None
    breaker = CircuitBreaker(timeout_threshold=max(3, params.max_concurrency))
    return RunPlan(run, RunResources(metric, cache, budget, breaker, close_budget=close_budget))


def _budget(spec: ChunkSpec) -> Budget:
    """The worker's share of the run's ``--max-requests`` / ``--max-cost-usd`` (counters in Prefect), else none."""
    params = spec.params
    if not params.max_requests and not params.max_cost_usd:
        return Budget()
    url = fleet.api_url()
    if url is None:
        options = budget_options(params.max_requests, params.max_cost_usd)
        raise ConfigError(f"{options}: no Prefect API in worker process {os.getpid()} to count the run's budget with")
    return FleetBudget(
        dict(spec.budget_counters), url, max_requests=params.max_requests, max_cost_usd=params.max_cost_usd,
        max_in_flight=params.max_concurrency,
    )  # fmt: skip


def score_spec(spec: ChunkSpec) -> ChunkReport:
    """Score the spec's chunk in this process: re-read its block, check its key, score it, write its file (its
    heap trimmed after)."""
    with checked_out(spec) as plan:
        if spec.positions:
            ids = list(spec.row_ids) if spec.row_ids else None
            raw = read_rows(plan.dataset, list(spec.positions), list(spec.same_as), ids)
        else:
            raw = read_block(plan.dataset, spec.source, spec.first_row, spec.rows, dict(spec.seen))
        block = plan.prepare_block(raw)
        key = steps.chunk_key(plan, block)
        if key != spec.key:
            rows = f"the {spec.rows} rows of chunk {spec.seq}" if spec.positions else (
                f"rows {spec.first_row}-{spec.first_row + spec.rows - 1}")  # fmt: skip
            raise DatasetError(
                f"{rows} read differently in a worker than when run "
                f"{spec.run_id} planned them: the dataset changed under the run; rerun",
                uri=spec.source,
            )
        report = steps.score_chunk(plan, spec.seq, block, key)
    _heap.trim_heap(_heap.TRIM_EVERY_S)  # the worker's heap too (recall_tasks/_heap.py)
    reason = plan.breaker.tripped_reason if plan.breaker is not None else None
    spent = plan.budget.exhausted_reason if plan.budget is not None else None
    return dataclasses.replace(report, stopped=reason, budget=spent) if reason or spent else report


def adopt(plan: RunPlan, report: ChunkReport) -> None:
    """The flow's side: a worker's tripped circuit breaker decides the run's outcome as the flow's own would."""
    if report.stopped and plan.breaker is not None and plan.breaker.tripped_reason is None:
        plan.breaker.tripped_reason = report.stopped
    budget = report.budget
    if budget and plan.budget is not None and plan.budget.exhausted_reason is None:
        plan.budget.exhausted_reason = budget


def _close(plan: RunPlan) -> None:
    """An old run's clean-up never fails a new run's chunk: ``RunResources.close`` logs what it cannot close."""
    plan.resources.close()
