"""After the commit: compare, tell Prefect and write the reports. The run's Prefect-facing tail.

One function per step the flow names (``publish_run``, ``raise_for_outcome``); the flow stays a table of contents.
What it shows where:

- logs: the committed counts, the status and its reason, the verdict (dataset values escaped, see ``_logging``);
- artifacts, keyed per dataset and metric (``artifacts.artifact_key``): the summary table, the comparison's
  markdown, the run's markdown report with the verdict, the HTML report link (presigned where possible);
- events: ``recall.run.completed`` always, ``recall.regression.detected`` when the verdict is regressed.

A failed run is neither compared nor used as a baseline; its tables and reports are still written.
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.events import emit_event

from recall_tasks.analysis import tracking
from recall_tasks.analysis.regression import Comparison
from recall_tasks.errors import RegressionDetected, RunFailed
from recall_tasks.pipeline.artifacts import artifact_key, browser_link, summary_table
from recall_tasks.reports.html import write_report
from recall_tasks.reports.summary import markdown_report, run_results


def log_commit(plan: Any, summary: dict[str, Any], logger: Any) -> None:
    """The committed counts, and the status reason (an error for a failed run)."""
    logger.info(
        "run %s committed: %s rows, %s scored, %s errors, %s skipped, %s cached, mean %s, status %s",
        plan.run_id, summary["rows"], summary["scored"], summary["errors"], summary["skipped"], summary["cached"],
        summary["mean_score"], summary["status"],
    )  # fmt: skip
    if summary["status_reason"]:
        log = logger.error if summary["status"] == "failed" else logger.warning
        log("run %s %s: %s", plan.run_id, summary["status"], summary["status_reason"])


def compare(plan: Any, summary: dict[str, Any], logger: Any) -> Comparison | None:
    """The comparison with the baseline (None for a failed run or the first of a series), logged."""
    if summary["status"] == "failed":
        logger.info("run %s failed: not compared with a baseline, and never used as one", plan.run_id)
        return None
    comparison = tracking.compare_with_baseline(plan, summary)
    if comparison is None:
        logger.info("run %s is the first of its series (no baseline %r)", plan.run_id, plan.params.baseline)
    else:
        logger.info(
            "run %s vs baseline %s: %s (mean delta %s)%s", plan.run_id, comparison.baseline_run_id,
            comparison.verdict, comparison.mean_delta, f": {comparison.reason}" if comparison.reason else "",
        )  # fmt: skip
    return comparison


def publish_run(plan: Any, summary: dict[str, Any], logger: Any) -> dict[str, Any]:
    """Log, compare, emit the events, write the reports and the artifacts; the summary the flow returns."""
    log_commit(plan, summary, logger)
    rows = run_results(plan)  # one scan of the run for both reports
    keys = {
        k: artifact_key(k, plan.dataset.name, plan.params.metric) for k in ("summary", "report", "regression", "html")
    }
    create_table_artifact(summary_table(summary), key=keys["summary"], description=f"run {plan.run_id}")
    create_link_artifact(plan.store.results_uri, link_text="results table", key="recall-results")
    comparison = compare(plan, summary, logger)
    resource = {"prefect.resource.id": f"recall.dataset.{plan.dataset.name}", "recall.run_id": plan.run_id}
    emit_event("recall.run.completed", resource=resource, payload=tracking.run_event_payload(summary))
    if comparison is not None:
        create_markdown_artifact(
            comparison.to_markdown(), key=keys["regression"],
            description=f"run {plan.run_id} vs {comparison.baseline_run_id}",
        )  # fmt: skip
        summary = {**summary, "comparison": comparison.event_payload()}
        if comparison.verdict == "regressed":
            emit_event("recall.regression.detected", resource=resource, payload=comparison.event_payload())
    drops = [w.model_dump() for w in comparison.worst_rows] if comparison is not None else []
    report_uri = write_report(plan.store, plan.run_id, rows, dataset=plan.dataset, drops=drops)
    link, link_note = browser_link(plan.store, "reports", f"{plan.run_id}.html")
    report_md = markdown_report(plan, summary, results=rows)
    if comparison is not None:
        report_md += "\n\n" + comparison.to_markdown()
    create_markdown_artifact(
        f"{report_md}\n\n[HTML report]({link}) ({link_note})", key=keys["report"],
        description=f"run {plan.run_id}: worst rows and verdict",
    )  # fmt: skip
    create_link_artifact(link, link_text=f"HTML report ({link_note})", key=keys["html"])
    return {**summary, "report_uri": report_uri}


def raise_for_outcome(plan: Any, summary: dict[str, Any]) -> None:
    """End the flow run Failed for a failed run (exit 4) or, with ``fail_on_regression``, a regression (exit 3)."""
    if summary["status"] == "failed":
        raise RunFailed(f"run {plan.run_id} failed: {summary['status_reason']}", summary)
    comparison = summary.get("comparison")
    if comparison and comparison["verdict"] == "regressed" and plan.params.fail_on_regression:
        lo, hi = comparison.get("ci") or (None, None)
        ci = f"95 % CI {lo:+.4f}..{hi:+.4f}" if lo is not None and hi is not None else "no CI"
        raise RegressionDetected(
            f"run {plan.run_id} regressed against {comparison['baseline_run_id']}: mean delta "
            f"{comparison['mean_delta']:+.4f} ({ci}), "
            f"{comparison['flips']['pass_to_fail']} rows pass->fail",
            summary,
        )
