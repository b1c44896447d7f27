"""What ``run``, ``demo`` and ``batch collect`` print about a run: the judge line, the summary table, the verdict
against the baseline and the warnings, or a ``--batch`` run's pending batches (nothing committed yet). Values are
plain text (never markup) and redacted."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from recall_tasks._logging import inert
from recall_tasks.cli.common import console, err, plain
from recall_tasks.cli.output import judge_line, print_table
from recall_tasks.config import RunParams
from recall_tasks.io.storage import is_local
from recall_tasks.reports.summary import substitution
from recall_tasks.secrets import redact
from recall_tasks.summaries import IdleSummary, PendingSummary, RunSummary


def print_summary(summary: RunSummary, output: str) -> None:
    """The run's summary table and where to look next; values are plain text (never markup), redacted."""
    from recall_tasks.reports.summary import summary_rows

    cells = [[row["field"], redact(row["value"])] for row in summary_rows(summary)]
    print_table(["field", "value"], cells, console, title=f"run {summary['run_id']}", show_header=False)
    query = "SELECT row_id, score, reason FROM results ORDER BY score LIMIT 5"
    console.print(Text(f'\nQuery the tables:\n  recall-bench query "{query}" --output {output}'), soft_wrap=True)
    if summary.get("report_uri"):
        console.print(Text(inert(f"HTML report: {summary['report_uri']}")), soft_wrap=True)
        if not is_local(str(summary["report_uri"])):  # a browser cannot open s3://: say how to get a local copy
            console.print(
                Text(f"  open it locally: recall-bench report {summary['run_id']} --output {output} --to ."),
                soft_wrap=True,
            )


def verdict_line(comparison: dict[str, Any], threshold: float | None = None) -> str:
    """``vs baseline X: regressed (mean delta -0.0867, 95 % CI -0.12..-0.05, 21 pass->fail / 0 fail->pass at
    threshold 0.5, 300 paired)``, the reason a comparison is incomparable, or ``too_few_rows (too few rows: 4
    paired, ...)``."""
    head = f"vs baseline {comparison['baseline_run_id']}: {comparison['verdict']}"
    if comparison.get("verdict") == "incomparable":
        return f"{head} ({comparison.get('reason')})"
    parts = [str(comparison.get("reason"))] if comparison.get("verdict") == "too_few_rows" else []
    if comparison.get("mean_delta") is not None:
        parts.append(f"mean delta {comparison['mean_delta']:+.4f}")
    lo, hi = (comparison.get("ci") or [None, None])[:2]
    if lo is not None and hi is not None:
        parts.append(f"95 % CI {lo:+.4f}..{hi:+.4f}")
    flips = comparison.get("flips") or {}
    at = f" at threshold {threshold:g}" if threshold is not None else ""
    parts.append(f"{flips.get('pass_to_fail', 0)} pass->fail / {flips.get('fail_to_pass', 0)} fail->pass{at}")
    parts.append(f"{comparison.get('n_paired', 0)} paired")
    return f"{head} ({', '.join(parts)})"


def print_outcome(summary: RunSummary, output: str) -> None:
    """Summary table, verdict line, report path and warnings: printed for every committed run (exit 0, 3, 4...).

    A run that ``--require-baseline`` stopped (``BaselineMissing``, a ``RegressionDetected``: the caller is about to
    print a regression and exit 3) ends here with its own line and exit 7."""
    if not summary:
        return
    print_summary(summary, output)
    comparison = summary.get("comparison")
    if comparison:
        console.print(plain(verdict_line(comparison, summary.get("threshold"))), soft_wrap=True)
        for warning in comparison.get("warnings") or []:
            err.print(f"[yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    elif summary.get("status") == "failed":
        console.print(
            "not compared with a baseline: a failed run is never compared nor used as a baseline", soft_wrap=True
        )
    else:
        console.print(plain(no_baseline_line(summary.get("no_baseline"))), soft_wrap=True)
    replied = substitution(summary)
    if replied is not None:
        err.print(
            f"[yellow]warning:[/] {replied[0]} row(s) were judged by {plain(replied[1])}, not "
            f"{plain(str(summary.get('judge_model')))}: the replies named another model (a gateway's fallback); "
            "their verdicts are not cached and results.reply_model names the model of each row",
            soft_wrap=True,
        )
    if summary.get("top_error"):
        err.print(
            f"[yellow]{summary['errors']} row(s) ended with an error; most common ({summary['top_error_count']} "
            f"rows): {plain(summary['top_error'])}[/]",
            soft_wrap=True,
        )
    if summary.get("status") == "budget_exhausted":
        err.print(f"[yellow]{plain(budget_line(summary))}[/]", soft_wrap=True)
    if summary.get("baseline_missing"):  # --require-baseline: exit 7 (the flow raised BaselineMissing)
        err.print(f"[bold red]no baseline:[/] {plain(summary['baseline_missing'])}", soft_wrap=True)
        raise typer.Exit(code=7)


def no_baseline_line(why: str | None) -> str:
    """What a run with no comparison prints: why there is none, and, when every earlier run failed or was stopped
    by a budget, that such runs are never chosen automatically."""
    first = "first run of its series"
    if why is None or why.startswith(first):  # "…; this output holds another series of …: --dataset-name …"
        return f"{first}: no baseline to compare with{(why or first)[len(first) :]}"
    if why.startswith("no comparable baseline"):
        return (
            f"{why}: a failed or budget-stopped run is never chosen as a baseline (--baseline RUN_ID may name a "
            "budget-stopped one)"
        )
    return why


def budget_line(summary: RunSummary) -> str:
    """The one line of a budget stop: the limit, the rows left unjudged, what was committed, and the canary if it
    lost its verdicts to the budget."""
    line = f"budget exhausted: {summary['status_reason']}; results committed (status budget_exhausted)"
    if summary.get("not_judged"):
        line += "; the next run judges the rest"
    unchecked, checked = summary.get("canary_errors") or 0, summary.get("canary_rows") or 0
    if summary.get("canary_id") and unchecked:
        if not checked:
            line += f"; the canary was not checked (none of its {unchecked} rows judged)"
        else:
            line += f"; the canary was checked on {checked} of its {checked + unchecked} rows"
    return line


def judge_line_of(params: RunParams) -> str:
    if params.metric == "retrieval_ids":
        return "judge: none (--metric retrieval_ids scores rows from their document ids: no request)"
    return redact(judge_line(params.judge, params.model, params.base_url))


def pending_lines(summary: PendingSummary | IdleSummary) -> list[str]:
    """The pending run's batches, one line each, and how to collect them (or why there is nothing to collect)."""
    if summary["status"] == "batch_idle":
        return [f"{summary['reason']} (record {summary['record']}); nothing committed"]
    batches = summary["batches"]
    lines = [
        f"run {summary['run_id']} pending: {summary['batched_rows']} row(s) in {len(batches)} batch(es) "
        f"of the Batch API (submitted {summary['submitted_at']}); nothing committed yet"
    ]
    for b in batches:
        counts = b.get("counts") or {}
        done = f", {counts.get('completed', 0)} done, {counts.get('failed', 0)} failed" if counts.get("total") else ""
        again = " (resubmitted lines)" if b["round"] > 1 else ""
        lines.append(f"  {b['id']}  {b['status']}  {b['requests']} request(s){again}{done}")
    lines.append(f"record: {summary['record']}")
    url = f" --base-url {summary['base_url']}" if summary.get("base_url") else ""
    lines.append(
        "rerun the same command to collect the results and finish the run (or add --wait to wait; or "
        f"`recall-bench batch collect -o {summary['output']}{url} {summary['run_key']}`)"
    )
    return lines


def print_pending(summary: PendingSummary | IdleSummary) -> None:
    for line in pending_lines(summary):
        console.print(plain(line), soft_wrap=True, highlight=False)
