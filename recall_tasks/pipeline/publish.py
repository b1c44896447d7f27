"""After the commit: compare, write the reports, and say what to tell Prefect. No Prefect import here.

One function per step the flow names (``publish_run``, ``raise_for_outcome``); the flow stays a table of contents.
``publish_run`` returns a :class:`Publication` (the artifacts and events to send) that the Prefect adapter
(``pipeline/flow.py``) sends, so this tail is unit-tested without a server. What it shows where:

- logs: the committed counts, the status and its reason, the verdict (dataset values escaped, see ``_logging``);
- artifacts, keyed per dataset and metric (``artifacts.artifact_key``): the summary table, the comparison's
  markdown, the run's markdown report with the verdict, the HTML report link (presigned where possible);
- events: ``recall.run.completed`` always; then at most one alert (``reports/alerts.py``): ``recall.run.failed``,
  ``recall.run.budget_exhausted``, ``recall.regression.detected`` or ``recall.comparison.incomparable``, its payload
  carrying the rendered message the shipped automation sends (``deployments/alerts.yaml``).

Every artifact is Markdown in the UI (a link artifact is ``[text](link)``), and the output location is data: a
flow-run parameter or an event's payload. Link targets are percent-encoded (``reports.markdown.md_url``: an
output ``/tmp/x) <img src=x onerror=alert(1)> (`` cannot end the link and add HTML), link texts escaped (``md_text``);
the reports' own Markdown escapes the dataset values it shows.

A failed run is neither compared nor used as a baseline; its tables and reports are still written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

from recall_tasks.analysis import tracking
from recall_tasks.analysis.regression import Comparison
from recall_tasks.errors import BaselineMissing, BudgetExhausted, IncomparableBaseline, RegressionDetected, RunFailed
from recall_tasks.pipeline.artifacts import artifact_key, browser_link, summary_table
from recall_tasks.reports.alerts import alert_for_run, alert_resource
from recall_tasks.reports.comparison import comparison_markdown
from recall_tasks.reports.html import write_report
from recall_tasks.reports.markdown import md_text, md_url
from recall_tasks.reports.summary import markdown_report, run_results
from recall_tasks.summaries import RunRow, RunSummary


@dataclass(frozen=True)
class Artifact:
    """A Prefect artifact to create: a table (``data`` rows), markdown (``data`` text) or a link (``data`` URL)."""

    kind: Literal["table", "markdown", "link"]
    key: str
    data: Any
    description: str = ""
    link_text: str = ""


@dataclass(frozen=True)
class Event:
    """A Prefect event to emit."""

    name: str
    resource: dict[str, str]
    payload: dict[str, Any]


@dataclass
class Publication:
    """What the run tells Prefect, in order."""

    artifacts: list[Artifact] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def log_commit(plan: Any, summary: RunRow, logger: Any) -> None:
    """The committed counts, and the status reason (an error for a failed run)."""
    logger.info(
        "run %s committed: %s rows, %s scored, %s errors, %s skipped, %s cached, mean %s, status %s",
        plan.run_id, summary["rows"], summary["scored"], summary["errors"], summary["skipped"], summary["cached"],
        summary["mean_score"], summary["status"],
    )  # fmt: skip
    if summary["status_reason"]:
        log = logger.error if summary["status"] == "failed" else logger.warning
        log("run %s %s: %s", plan.run_id, summary["status"], summary["status_reason"])


def compare(plan: Any, summary: RunRow, logger: Any) -> tuple[Comparison | None, str | None]:
    """The comparison with the baseline, or None and why not (a failed run, the first of a series...), logged."""
    if summary["status"] == "failed":
        logger.info("run %s failed: not compared with a baseline, and never used as one", plan.run_id)
        return None, "not compared (failed run)"
    comparison = tracking.compare_with_baseline(plan, summary)
    if comparison is None:
        why = tracking.why_no_baseline(plan)
        logger.info("run %s: %s (--baseline %r)", plan.run_id, why, plan.params.baseline)
        return None, why
    else:
        logger.info(
            "run %s vs baseline %s: %s (mean delta %s)%s", plan.run_id, comparison.baseline_run_id,
            comparison.verdict, comparison.mean_delta, f": {comparison.reason}" if comparison.reason else "",
        )  # fmt: skip
    return comparison, None


def publish_run(plan: Any, row: RunRow, logger: Any) -> tuple[RunSummary, Publication]:
    """Log, compare, write the reports; the summary the flow returns and what to send to Prefect."""
    summary = cast("RunSummary", {**row})  # comparison and report_uri are added below
    log_commit(plan, row, logger)
    out = Publication()
    keys = {
        k: artifact_key(k, plan.dataset.name, plan.params.metric) for k in ("summary", "report", "regression", "html")
    }
    out.artifacts.append(Artifact("table", keys["summary"], summary_table(row), f"run {plan.run_id}"))
    out.artifacts.append(Artifact("link", "recall-results", md_url(plan.store.results_uri), link_text="results table"))
    comparison, no_baseline = compare(plan, row, logger)
    if no_baseline is not None:
        summary["no_baseline"] = no_baseline
    resource = alert_resource(plan.dataset.name, plan.run_id, plan.params.label)
    out.events.append(Event("recall.run.completed", resource, tracking.run_event_payload(row)))
    if comparison is not None:
        out.artifacts.append(
            Artifact(
                "markdown", keys["regression"], comparison_markdown(comparison, plan.params.threshold),
                f"run {plan.run_id} vs {comparison.baseline_run_id}",
            )
        )  # fmt: skip
        summary["comparison"] = comparison.event_payload()
    drops = [w.model_dump() for w in comparison.worst_rows] if comparison is not None else []
    rows = run_results(plan, wanted=[str(d["row_id"]) for d in drops])  # one scan of the run for both reports
    report_uri = write_report(plan.store, plan.run_id, rows, dataset=plan.dataset, drops=drops)
    link, link_note = browser_link(plan.store, "reports", f"{plan.run_id}.html")
    link, link_note = md_url(link), md_text(link_note)  # Markdown: the output's URI is data (module docstring)
    report_md = markdown_report(plan, summary, results=rows)
    if comparison is not None:
        report_md += "\n\n" + comparison_markdown(comparison, plan.params.threshold)
    out.artifacts.append(
        Artifact(
            "markdown", keys["report"], f"{report_md}\n\n[HTML report]({link}) ({link_note})",
            f"run {plan.run_id}: worst rows and verdict",
        )
    )  # fmt: skip
    out.artifacts.append(Artifact("link", keys["html"], link, link_text=f"HTML report ({link_note})"))
    summary["report_uri"] = report_uri
    alert = alert_for_run(row, comparison, report_uri)
    if alert is not None:
        out.events.append(Event(alert.name, alert.resource, alert.payload))
    return summary, out


def raise_for_outcome(plan: Any, summary: RunSummary) -> None:
    """End the flow run Failed unless the run completed and passes its gate; the first that applies:

    a failed run (exit 4), a budget stop (exit 5), with ``fail_on_regression`` a regression (exit 3), then an
    incomparable comparison unless ``allow_incomparable`` (exit 6), then, with ``require_baseline``, no comparison
    at all (exit 7). The summary travels in the exception.
    """
    if summary["status"] == "failed":
        raise RunFailed(f"run {plan.run_id} failed: {summary['status_reason']}", summary)
    if summary["status"] == "budget_exhausted":
        raise BudgetExhausted(f"run {plan.run_id} stopped by its budget: {summary['status_reason']}", summary)
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
    p = plan.params
    if comparison and comparison["verdict"] == "incomparable" and p.fail_on_regression and not p.allow_incomparable:
        raise IncomparableBaseline(
            f"run {plan.run_id} is not comparable with its baseline {comparison['baseline_run_id']}: "
            f"{comparison.get('reason')} (--fail-on-regression; --allow-incomparable lets such a run pass)",
            summary,
        )
    if not comparison and getattr(p, "require_baseline", False):
        summary["baseline_missing"] = (
            f"run {plan.run_id} has no baseline to compare with (--require-baseline): "
            f"{summary.get('no_baseline') or 'no baseline found'}"
        )
        raise BaselineMissing(summary["baseline_missing"], summary)
