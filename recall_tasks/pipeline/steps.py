"""The steps of a benchmark run as plain functions; ``flows/recall_flow.py`` only orchestrates them.

``plan_run`` validates everything (parameters, output location, dataset schema, row ids, segment columns,
judge configuration and reachability, the baseline reference: :func:`check_run`, the checks themselves in
:mod:`~recall_tasks.pipeline.checks`; then every row read once for the chunks' layout) before it takes the run's
lease or writes anything, and builds the run object (:mod:`~recall_tasks.pipeline.run`: spec, resources, window).
``score_chunk`` scores one block and stages its results.
:func:`~recall_tasks.pipeline.commit.commit_run` aggregates the staged results, commits them and the run rows at
once, with the run's status decided by :func:`~recall_tasks.pipeline.outcome.run_outcome` (``failed``,
``budget_exhausted`` or ``completed``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import secrets as pysecrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.compute as pc

from recall_tasks._sync import Cancelled, CancelScope
from recall_tasks.config import RUN_KEY_FIELDS, RunParams
from recall_tasks.errors import ConfigError, RunInterrupted, StorageError, StoreUnreachable
from recall_tasks.fleet import ledger
from recall_tasks.fleet.guards import NOT_JUDGED, Budget, CircuitBreaker
from recall_tasks.io.blocks import Layout, RowBlock, iter_layout, plan_layout
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.io.datasets import Dataset
from recall_tasks.io.results import ResultStore, check_format
from recall_tasks.io.retrieval import RetrievalResults, load_retriever
from recall_tasks.io.storage import StorageConfig, join_uri, normalize_uri
from recall_tasks.judges.base import SUBSTITUTED_FLAG
from recall_tasks.judges.capabilities import Preflighted
from recall_tasks.metrics import ContextualRecall, Metric
from recall_tasks.pipeline import dask_paths, ids_step, progress
from recall_tasks.pipeline.artifacts import report_link_seconds
from recall_tasks.pipeline.canary import open_canary
from recall_tasks.pipeline.checks import (
    Checked,
    check_baseline_reference,
    check_context_source,
    check_output_location,
    check_priced,
    check_results_schema,
    check_retrieval_coverage,
    check_segments,
)
from recall_tasks.pipeline.components import (
    check_units,
    make_judge,
    make_metric,
    open_run_dataset,
    release_judge,
    share_limits,
)
from recall_tasks.pipeline.run import (
    NO_OBSERVER,
    ChunkReport,
    ChunkWindow,
    RunObserver,
    RunPlan,
    RunResources,
    RunSpec,
)
from recall_tasks.pipeline.scoring import metric_fingerprint, score_block

log = logging.getLogger(__name__)


def new_run_id() -> str:
    """Sortable and unique: ``20261130T171502Z-3f9a1c``."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + pysecrets.token_hex(3)


def blocks(plan: RunPlan) -> Iterator[RowBlock]:
    """The run's chunks in order (before ``prepare_block``): identical rows land in one chunk, so they share one
    judge request whatever process scores it (``io/blocks.plan_layout``, planned on first use)."""
    window = plan.window
    if window.layout is None:
        window.layout = layout_of(plan.dataset, plan.params.chunk_size)
    return iter_layout(plan.dataset, window.layout, plan.params.chunk_size)


def layout_of(dataset: Dataset, chunk_size: int) -> Layout:
    """The run's chunks (``io/blocks.plan_layout``): every row read and decoded once."""
    layout = plan_layout(dataset, chunk_size)
    if layout.repeats:
        log.info("%d row(s) repeat an earlier row: each set of identical rows is judged once, in one chunk",
                 layout.repeats)  # fmt: skip
    return layout


def results_config(params: RunParams, dataset: Dataset, metric: Metric) -> dict[str, Any]:
    """What the results are scored under (metric and judge fingerprint, threshold, scale, strict mode, on_missing,
    output, pass-through columns, chunk schema, id metrics): the config hash's payload, and part of the run key."""
    return {
        "metric": metric_fingerprint(metric), "threshold": params.threshold, "scale": params.scale,
        "strict": params.strict_mode, "on_missing": params.on_missing, "output": normalize_uri(params.output_uri),
        "passthrough": dataset.passthrough, "chunk_schema": CHUNK_SCHEMA_VERSION, **ids_step.config_of(params),
    }  # fmt: skip


def _run_key(params: RunParams, dataset: Dataset, metric: Metric) -> str:
    """Same results of the same data in the same place -> same key (an unfinished attempt with it is resumed).

    The configuration the results are scored under (:func:`results_config`), the dataset (fingerprint: every file's
    path, size, ETag or mtime and rows; identity: its URI or ``--dataset-name``) and the parameters
    :data:`~recall_tasks.config.RUN_KEY_FIELDS` names, its locations normalised. An allowlist: a rerun with another
    ``--max-concurrency``, ``--chunk-size``, ``--tpm``, cap, runner... resumes the run (docs/design.md, "Resume").
    """
    named = {name: getattr(params, name) for name in RUN_KEY_FIELDS}
    for name in ("dataset_uri", "output_uri", "retrieval_uri", "canary"):
        if named[name] is not None:
            named[name] = normalize_uri(named[name])
    data = {"fingerprint": dataset.fingerprint, "identity": dataset.identity, "rows": dataset.row_identity}
    payload = json.dumps([results_config(params, dataset, metric), data, named], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def check_run(params: RunParams, *, contact: bool = True) -> Checked:
    """Every check that can fail a run, in order of cost, before any judge call or write.

    Output location, dataset (files, schema, row ids), the output's format (one format per output), retriever, segment
    columns, output store, baseline reference, judge configuration and endpoint (one cheap request). Raises one
    :class:`ConfigError`. ``contact=False`` (``run --dry-run``): the same checks without the endpoint's probes
    (``GET /models``, the Batch API's), so a dry run refuses what the run refuses and contacts no endpoint.
    """
    check_output_location(params)
    check_units(params)
    report_link_seconds()  # RECALL_BENCH_REPORT_LINK_S: a bad value refused now, not after the commit
    storage = StorageConfig.from_options(params.storage_options)
    dataset = open_run_dataset(params, storage, bool(params.retriever or params.retrieval_uri))
    if contact:
        dask_paths.check_workers_see(params, dataset)  # --dask-address: the workers see these local paths
    check_format(params.output_uri, storage, params.format, writes=True)
    trace = check_context_source(params, dataset)
    if params.dataset_name:
        dataset.name, dataset.identity = params.dataset_name, f"name:{params.dataset_name}"
    retriever = load_retriever(params.retriever) if params.retriever else None
    retrieval = RetrievalResults(params.retrieval_uri, storage) if params.retrieval_uri else None
    segments = check_segments(params, dataset)
    canary = open_canary(params, storage)
    try:
        store = ResultStore(params.output_uri, storage, params.format, params.catalog, params.namespace)
    except (ValueError, ImportError, OSError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ConfigError(f"cannot open the output {params.output_uri}: {detail}") from None
    check_results_schema(dataset, store)
    ids = ids_step.check_ids(params, dataset, storage, retrieval, retriever is not None)  # before any write
    check_baseline_reference(params, store, dataset)
    notes = [ids.note] if ids is not None and ids.note else []  # qrels that lack some rows
    if retrieval is not None:
        note = check_retrieval_coverage(params, dataset, retrieval)
        if note:
            notes.append(note)
    judge = make_judge(params)
    try:  # a refusal after the probe closes the judge's client: its socket must not outlive the loop it is on
        probe = judge.preflight if contact and isinstance(judge, Preflighted) else None
        if probe is not None:
            note = probe()
            if note:
                notes.append(note)
        check_priced(params, judge)
        if params.batch:
            from recall_tasks.pipeline.batch.checks import check_batch

            check_batch(params, judge, probe=contact)
        metric = make_metric(params, judge)
    except BaseException:
        release_judge(judge)
        raise
    return Checked(storage, dataset, store, metric, segments, retriever, retrieval, notes, trace, canary)


#: How long an aborted run waits for each chunk in flight to settle after cancelling its judge calls.
ABORT_WAIT_S = 2.0


def plan_run(
    params: RunParams,
    run_id: str | None = None,
    *,
    share: bool = True,
    on_wait: Callable[[str], None] | None = None,
    scope: CancelScope | None = None,
) -> RunPlan:
    """Check the run, then take its lease and open what it needs; raise one clear error otherwise.

    The inputs are checked first (:func:`check_run`, then every row read once for the chunks' layout: a data page
    that does not decode fails here), and only then is the lease taken: a run refused by its inputs leaves no
    marker and no lease behind. ``share``: give the judges their fleet-wide ``--rpm``/``--tpm`` grant sources.
    ``on_wait``: told once when ``--wait-for-lock`` waits for another attempt of the run (the observer's
    ``waiting``). ``scope``: the run's cancel scope (a caller that may cancel this run passes its own); a lease
    another attempt takes over cancels it, so the attempt stops spending at once.
    """
    checked = check_run(params)
    dataset, store, metric = checked.dataset, checked.store, checked.metric
    try:
        layout = layout_of(dataset, params.chunk_size)  # every row decoded once: a bad page stops the run here
    except BaseException:
        release_judge(metric.judge)
        raise
    if share:
        share_limits(params, metric)
    run_key = _run_key(params, dataset, metric)
    started = dt.datetime.now(dt.UTC)
    scope = scope if scope is not None else CancelScope()

    def lost(why: str) -> None:
        scope.cancel()  # the judge calls stop now, not at the commit

    # the lease before the cache: an attempt that waited for another opens the row cache as that one left it
    the_run_id, started, resumed = store.begin_run(
        run_key, run_id or new_run_id(), started, wait=params.wait_for_lock, on_wait=on_wait, on_lost=lost
    )
    cache = None
    if params.cache:
        cache_uri = params.cache_uri or join_uri(params.output_uri, "cache")
        cache = RowVerdictCache(cache_uri, checked.storage, read=not params.refresh_cache)
        if isinstance(metric, ContextualRecall) and metric.claim_units is not None:
            metric.claim_units.store = cache.claims  # claims persist next to the verdicts, no expiry
    capped = bool(params.max_requests or params.max_cost_usd)
    counters = the_run_id if capped and params.task_runner == "threads" else None  # an earlier attempt's workers'
    spent = ledger.spent(store, run_key, counters) if resumed else (0, 0.0)  # the budget holds per run, not attempt
    config = results_config(params, dataset, metric)
    spec = RunSpec(
        params=params, run_id=the_run_id, run_key=run_key, resumed=resumed, dataset=dataset, store=store,
        started_at=started, started_clock=time.perf_counter(), segment_columns=tuple(checked.segments),
        config_hash=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16],
        retriever=checked.retriever, retrieval=checked.retrieval, notes=tuple(checked.notes), trace=checked.trace,
        canary=checked.canary,
    )  # fmt: skip
    budget = Budget(params.max_requests, params.max_cost_usd, max_in_flight=params.max_concurrency, spent=spent)
    if capped and params.task_runner == "threads":  # reservations held on the store before they are sent
        budget.ledger = ledger.Ledger(store, run_key, spec.attempt, budget)
    resources = RunResources(
        metric, cache, budget,
        CircuitBreaker(timeout_threshold=max(3, params.max_concurrency)), scope=scope,
    )  # fmt: skip
    if cache is not None:  # the entries it puts name this attempt: a resumed attempt counts them as its spend
        cache.attempt = f"{spec.run_id}/{spec.attempt}"
    plan = RunPlan(spec, resources, ChunkWindow(layout=layout))
    if share:
        _count_budget(plan)
    return plan


def _count_budget(plan: RunPlan) -> None:
    """``--max-requests`` / ``--max-cost-usd`` with worker processes: the run attempt's counters in Prefect
    (``fleet/budget``)."""
    params = plan.params
    if not plan.budget_counters and params.task_runner != "threads" and (params.max_requests or params.max_cost_usd):
        from recall_tasks.fleet import budget as fleet_budget

        spent = (plan.budget.requests, plan.budget.cost_usd) if plan.budget is not None else (0, 0.0)
        plan.budget_counters.update(fleet_budget.create_counters(params, plan.run_id, spent))


def chunk_key(plan: RunPlan, block: RowBlock) -> str:
    """Content address of a chunk's results: its rows (ids, content, pass-through values) and the config.

    Prefect's chunk cache is keyed on this; it never sees run ids, timestamps or Arrow objects.
    """
    h = hashlib.sha256(plan.config_hash.encode())
    for row_id, content in zip(block.row_ids, block.content_hashes, strict=True):
        h.update(f"{row_id}\x00{content}\x01".encode())
    passthrough = [c for c in block.table.column_names if c not in _ROLE_COLUMNS]
    if passthrough:
        h.update(json.dumps(block.table.select(passthrough).to_pydict(), default=str).encode())
    return h.hexdigest()[:32]


_ROLE_COLUMNS = {"input", "expected_output", "retrieval_context", "actual_output"}


def score_chunk(plan: RunPlan, seq: int, block: RowBlock, key: str) -> ChunkReport:
    """Score one block (async judge calls on the shared loop) and write its result file.

    Raises :class:`RunInterrupted` if the run is aborted before or while the block is judged (no file written).
    """
    try:
        with progress.counting_rows(seq, plan.window.observer):  # the rows as they settle, for the CLI's bar
            if plan.params.metric == "retrieval_ids":  # no judge: the ids alone (pipeline/ids_step.py)
                table = ids_step.score_ids_block(plan, block)
            else:
                judged = plan.scope.run(
                    score_block(plan.metric, block, plan.cache, plan.budget, plan.breaker, plan.shared)
                )
                table = ids_step.with_id_metrics(plan, block, judged)
    except Cancelled:
        raise RunInterrupted(f"run {plan.run_id} was interrupted; chunk {seq} not scored") from None
    if plan.cache is not None:
        plan.cache.flush()
    path = plan.store.chunk_path(key, plan.run_id)
    plan.store.write_chunk(path, table)
    errors = int(pc.sum(pc.is_valid(table.column("error"))).as_py() or 0)
    scored = int(pc.sum(pc.is_valid(table.column("score"))).as_py() or 0)
    not_judged = pc.and_(table.column("skipped"), pc.starts_with(table.column("reason"), NOT_JUDGED))
    flags = pc.list_flatten(table.column("flags"))
    substituted = int(pc.sum(pc.starts_with(flags, SUBSTITUTED_FLAG)).as_py() or 0) if len(flags) else 0
    return ChunkReport(
        seq=seq, rows=table.num_rows, errors=errors, scored=scored, path=path,
        not_judged=int(pc.sum(pc.fill_null(not_judged, False)).as_py() or 0), pid=os.getpid(),
        substituted=substituted,
    )  # fmt: skip


#: Part of every chunk key: bumped when a chunk file's columns change, so older chunk files are not reused.
CHUNK_SCHEMA_VERSION = 3


def abort(plan: RunPlan) -> None:
    """Stop judging now: cancel the run's judge calls in flight; chunks not started yet refuse to start.

    Called by the flow on any exception in the chunk loop (an interrupt, a configuration error): a cancelled
    request is not waited for and never billed further; rows already judged are in the row cache (flushed by
    :func:`keep_judged`).
    """
    plan.scope.cancel()


def keep_judged(plan: RunPlan, observer: RunObserver = NO_OBSERVER) -> int:
    """After an abort, once the chunk tasks have settled: flush the row cache; tell the observer.

    Returns how many rows this run judged and cached: a rerun of the same command resumes with them. Once per run:
    the chunk loop and the flow around it both call it on an abort (the flow also for an interrupt that lands
    before the loop started), the first one keeps and tells, a later call returns 0.
    """
    if not plan.resources.keep_once():
        return 0
    cached = 0
    if plan.cache is not None:
        try:
            plan.cache.flush()
        except Exception as exc:  # noqa: BLE001 - the abort's own error matters more than a lost flush
            log.warning("could not save the row cache after the interrupt: %s", exc)
        cached = plan.cache.stored
    _record_spend(plan)
    observer.aborted(cached)
    return cached


def store_outage(plan: RunPlan, exc: StorageError) -> StoreUnreachable:
    """The error of a run whose object storage failed while judging (after :func:`keep_judged`): it names the store
    and the output, and where the judged rows are (the row cache's local spill when the cache could not be saved)."""
    cache = plan.cache
    if cache is not None and cache.spilled:
        kept = (
            f"{cache.spilled} judged rows were kept in the row cache's local spill {cache.spill} (the row cache "
            "could not be saved to the output)"
        )
    else:
        kept = "the rows judged so far are in the row cache (or its local spill on the machine that judged them)"
    return StoreUnreachable(
        f"run {plan.run_id} stopped: object storage failed while judging ({exc}); nothing committed to "
        f"{plan.params.output_uri}; {kept}: rerun the same command once the store is back, they are not paid again"
    )


def _record_spend(plan: RunPlan) -> None:
    """The attempt ends without its commit: its ledger file holds its exact figure, for a resumed attempt (threads;
    worker processes count in Prefect). While it judged, its reservations were written ahead (``fleet/ledger``)."""
    if plan.budget is not None and plan.params.task_runner == "threads":
        ledger.record(plan.store, plan.run_key, plan.attempt, plan.budget)


def release(plan: RunPlan) -> None:
    """Close the run's resources (judge, row cache, budget), each once: :meth:`RunResources.close`."""
    plan.resources.close()


def let_go(plan: RunPlan) -> None:
    """The attempt ends without a commit (interrupt, error, pending batch): its lease goes, its marker stays."""
    plan.store.release_run()


def check_lease(plan: RunPlan) -> None:
    """Before the commit: an attempt whose lease another attempt took over commits nothing (exit 4)."""
    from recall_tasks.io.lease import LeaseLost

    lease = plan.store.lease
    if lease is None:
        return
    with contextlib.suppress(LeaseLost):  # sets lease.lost
        lease.renew()  # a conditional write now: a takeover since the last renewal is found here
    if lease.lost is not None:
        raise LeaseLost(f"{lease.lost}: nothing committed by this attempt")


def finish_run(plan: RunPlan) -> None:
    """The run is committed and compared: a rerun of the same command now starts a new run."""
    plan.store.end_run(plan.run_key)
    ledger.clear(plan.store, plan.run_key)
    if plan.budget_counters:
        from recall_tasks.fleet import budget as fleet_budget

        fleet_budget.delete_counters(plan.budget_counters.values())
