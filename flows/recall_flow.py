"""The benchmark flow: validate -> score chunks (mapped tasks) -> commit -> report. Logic lives in recall_tasks."""

from __future__ import annotations

from collections import deque
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from recall_tasks import pipeline
from recall_tasks.config import RunParams
from recall_tasks.datasets import iter_blocks
from recall_tasks.errors import JudgeTransientError, StorageError
from recall_tasks.report import markdown_report, summary_rows


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk only for failures that may pass: storage hiccups and judge transients."""
    try:
        state.result()
    except (StorageError, JudgeTransientError, ConnectionError, TimeoutError):
        return True
    except Exception:  # noqa: BLE001 - configuration errors and bugs are not retried
        return False
    return False


@task(
    name="score-chunk",
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=_transient,
    cache_policy=NO_CACHE,
    log_prints=False,
)
def score_chunk(plan: pipeline.RunPlan, seq: int, block: Any) -> pipeline.ChunkReport:
    """Score one chunk of rows and stage its results (idempotent: the same part file is rewritten)."""
    return pipeline.score_chunk(plan, seq, block)


def _flow_run_name() -> str:
    params = get_run_context().flow_run.parameters["params"]  # type: ignore[union-attr]
    get = params.get if isinstance(params, dict) else lambda k: getattr(params, k)
    name = str(get("dataset_uri")).rstrip("/").split("/")[-1]
    return f"recall-{name}-{get('label') or 'adhoc'}"


@flow(
    name="recall-benchmark",
    flow_run_name=_flow_run_name,
    log_prints=False,
    task_runner=ThreadPoolTaskRunner(max_workers=8),
)  # type: ignore[arg-type]
def recall_benchmark(params: RunParams) -> dict[str, Any]:
    """Score a dataset's contextual recall and commit per-row results and run aggregates."""
    logger = get_run_logger()
    plan = pipeline.plan_run(params)
    ctx = get_run_context()
    flow_run_id = str(ctx.flow_run.id) if getattr(ctx, "flow_run", None) else None  # type: ignore[union-attr]
    total = plan.dataset.num_rows
    logger.info(
        "run %s: %s rows from %s (%d file(s)), metric %s, judge %s",
        plan.run_id,
        total,
        plan.dataset.uri,
        len(plan.dataset.files),
        params.metric,
        plan.metric.judge.model,
    )
    progress_id = create_progress_artifact(progress=0.0, description=f"rows scored in run {plan.run_id}")
    window: deque[PrefectFuture[pipeline.ChunkReport]] = deque()
    done_rows = 0
    errors = 0

    def settle(future: PrefectFuture[pipeline.ChunkReport]) -> None:
        nonlocal done_rows, errors
        report = future.result()
        done_rows += report.rows
        errors += report.errors
        pipeline.notify_progress(done_rows, total)
        if total:
            update_progress_artifact(progress_id, progress=100.0 * done_rows / total)

    try:
        for seq, block in enumerate(iter_blocks(plan.dataset, params.chunk_size)):
            window.append(score_chunk.submit(quote(plan), seq, quote(block)))
            while len(window) >= params.max_workers:
                settle(window.popleft())
        while window:
            settle(window.popleft())
    except BaseException:
        for future in window:
            future.wait()
        plan.store.discard(plan.run_id)
        raise
    summary = pipeline.commit_run(plan, flow_run_id)
    logger.info(
        "run %s committed: %s scored, %s errors, %s skipped, mean %.3f",
        plan.run_id,
        summary["scored"],
        summary["errors"],
        summary["skipped"],
        summary["mean_score"] or 0.0,
    )
    create_table_artifact(summary_rows(summary), key="recall-summary", description=f"run {plan.run_id}")
    create_markdown_artifact(
        markdown_report(plan, summary), key="recall-report", description=f"worst rows of run {plan.run_id}"
    )
    create_link_artifact(plan.store.results_uri, link_text="results table", key="recall-results")
    return summary
