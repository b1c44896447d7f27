"""The run's last step: aggregate its chunk files, record its outcome and commit its results and runs rows.

Called by the flow once every chunk is scored (``flow.recall_benchmark``); the tables' atomic commit itself is
:meth:`~recall_tasks.io.results.ResultStore.commit`.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from recall_tasks.analysis.tally import RunTally
from recall_tasks.fleet.guards import NOT_JUDGED
from recall_tasks.io.results import ChunkPart, today
from recall_tasks.metrics.claims import claim_units_of
from recall_tasks.pipeline import ids_step
from recall_tasks.pipeline.canary import no_canary, score_canary
from recall_tasks.pipeline.outcome import run_outcome
from recall_tasks.pipeline.run import RunPlan
from recall_tasks.pipeline.scoring import metric_fingerprint
from recall_tasks.sentences import SPLITTER_VERSION
from recall_tasks.summaries import RunRow

_SUMMARY_COLUMNS = [
    "score", "success", "error", "skipped", "cached", "prompt_tokens", "completion_tokens", "requests", "cost_usd",
    "context_precision", "chunks_used", "context_count", "reply_model", "flags",
]  # fmt: skip


def commit_run(
    plan: RunPlan, parts: list[ChunkPart], flow_run_id: str | None = None, batch: dict[str, Any] | None = None
) -> RunRow:
    """Aggregate the run's chunk files, commit results and run rows; returns the overall run row.

    The chunk files are aggregated one batch at a time (:class:`~recall_tasks.analysis.tally.RunTally`): a table
    of every row's summary columns was ~100 bytes a row, the largest thing a 1,000,000-row commit held.

    ``batch``: a ``--batch`` run's ``batch_ids`` and ``batch_wait_s`` (``batch.finish.batch_columns``). The row
    cache is closed (compacted) here, before the tables are written: a rerun finds it in place.
    """
    tally = RunTally(plan.segment_columns)
    if parts:
        for rows in plan.store.read_parts(parts, columns=[*_SUMMARY_COLUMNS, *plan.segment_columns, "reason"]):
            tally.add(_not_judged_flag(rows))
    stats = tally.stats()
    canary: dict[str, Any] = no_canary()
    spend: dict[str, Any] = {}
    if plan.canary is not None:  # judged before the cache closes; fresh when the run judged anything afresh
        fresh = stats["requests"] > 0 or stats["scored"] > stats["cached"]
        canary, spend = score_canary(plan, plan.canary, fresh=fresh)
    plan.resources.close_cache()
    p = plan.params
    judge = plan.metric.judge
    base = {
        "run_id": plan.run_id, "flow_run_id": flow_run_id, "started_at": plan.started_at,
        "finished_at": dt.datetime.now(dt.UTC), "dataset": plan.dataset.name, "run_date": today(),
        "dataset_uri": p.dataset_uri, "dataset_fingerprint": plan.dataset.fingerprint, "label": p.label,
        "index_version": p.index_version or p.label, "metric": p.metric, "judge_model": judge.model,
        "prompt_version": judge.prompt_version, "threshold": p.threshold, "scale": p.scale,
        "wall_seconds": time.perf_counter() - plan.started_clock,
        **run_settings(plan), "batch_ids": None, "batch_wait_s": None, **(batch or {}), **no_canary(),
        "reply_models": None, "substituted_rows": None,
    }  # fmt: skip
    base.update(run_outcome(plan, tally.dominant_error(), stats))
    overall = {**base, "segment_column": None, "segment_value": None, **stats, **canary, **tally.replied()}
    for key, value in spend.items():  # the canary's spend is the run's: requests, tokens and cost include it
        overall[key] += value
    runs = [overall]
    for col in plan.segment_columns:
        for value, stats in tally.segments(col):
            runs.append({**base, "segment_column": col, "segment_value": value, **stats})
    ids_step.add_run_columns(plan, parts, runs)  # the id metrics' means and intervals (issue 41)
    plan.store.commit(plan.run_id, plan.dataset.name, base["run_date"], parts, runs, label=plan.params.label)
    pa.default_memory_pool().release_unused()  # the rows read for the commit: the report reads its own
    return cast("RunRow", overall)  # its keys are RUN_FIELDS' (tests/test_pipeline.py checks a real run's)


def _not_judged_flag(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its ``reason`` (a chunk's text, read one batch at a time) replaced by ``not_judged``: rows a
    budget or the circuit breaker kept from the judge, told from ``--on-missing skip`` rows by their reason."""
    flag = pc.fill_null(pc.and_(batch.column("skipped"), pc.starts_with(batch.column("reason"), NOT_JUDGED)), False)
    keep = [name for name in batch.schema.names if name != "reason"]
    return pa.RecordBatch.from_arrays([*(batch.column(n) for n in keep), flag], names=[*keep, "not_judged"])


def run_settings(plan: RunPlan) -> dict[str, Any]:
    """The settings that decide whether two runs' scores are comparable (``comparability.incomparable_reasons``)."""
    config = plan.metric.judge.config()
    return {
        "judge": plan.params.judge,
        "units": "claims" if claim_units_of(plan.metric) is not None else "sentences",
        "schema_version": config.get("schema_version"),
        "splitter_version": SPLITTER_VERSION,
        "judge_config": metric_fingerprint(plan.metric),
        "row_identity": plan.dataset.row_identity,
        "dataset_id": plan.dataset.identity,
    }
