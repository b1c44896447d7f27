"""Alerts: the one event a run sends when a person should act, with a payload that carries the whole message.

A finished run is worth a message when it **failed** (error rate above ``--max-error-rate``, the circuit breaker,
a worker process that died), was **stopped by its budget** (``--max-cost-usd`` / ``--max-requests``), **regressed**
against its baseline, or could not be compared with the baseline it was given (**incomparable**: someone changed
the judge, the prompt, the dataset...). Unchanged, improved, too_few_rows and first runs stay quiet. At most one
alert per dataset per run, the first that applies in that order (a failed run is never compared; a budget stop
that also regressed is one budget message whose payload still holds the comparison).

Each kind is its own Prefect event (:data:`ALERT_EVENTS`), so an automation can listen to some of them only; the
shipped one (``deployments/alerts.yaml``, ``recall-bench alerts install``) listens to all four. The payload holds
the figures as data (dataset, label, mean and interval against the baseline's, pass->fail flips, the segments that
moved most, the three rows that lost most with their lost sentences, the HTML report's location) and the message
already rendered: ``subject`` and ``message``, CommonMark in which every dataset value is escaped
(:func:`~recall_tasks.reports.markdown.md_text` / ``md_code``), so a row's text never becomes markup, a link, an
image or a mention in Slack, Teams, e-mail or a custom webhook. Texts recall-bench did not write (reasons, errors)
go through :func:`~recall_tasks.secrets.redact` first; the report location is the stored URI, never a presigned
link (its signature is a credential).

No Prefect import here: ``pipeline/publish.py`` turns an :class:`Alert` into an event, ``pipeline/flow.py`` sends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from recall_tasks.analysis.regression import Comparison
from recall_tasks.reports.formatting import fmt_number
from recall_tasks.reports.markdown import md_code, md_text
from recall_tasks.secrets import redact

__all__ = ["ALERT_EVENTS", "Alert", "AlertKind", "alert_for_run", "alert_for_worker_death", "alert_resource"]

AlertKind = Literal["failed", "budget_exhausted", "regressed", "incomparable"]

#: The event of each kind of alert (``recall.regression.detected`` predates the others and keeps its name).
ALERT_EVENTS: dict[AlertKind, str] = {
    "failed": "recall.run.failed",
    "budget_exhausted": "recall.run.budget_exhausted",
    "regressed": "recall.regression.detected",
    "incomparable": "recall.comparison.incomparable",
}
TITLES: dict[AlertKind, str] = {
    "failed": "recall run failed",
    "budget_exhausted": "recall run stopped by its budget",
    "regressed": "recall regressed",
    "incomparable": "recall run not comparable with its baseline",
}
TOP_SEGMENTS = 3
WORST_ROWS = 3
LOST_PER_ROW = 3
#: Characters of one dataset value in the message (a lost sentence, a reason); the payload's lists are clipped too.
CLIP = 300


@dataclass(frozen=True)
class Alert:
    """An alert event to send: its name, the run's resource (dataset and label as labels) and the payload."""

    kind: AlertKind
    name: str
    resource: dict[str, str]
    payload: dict[str, Any]


def alert_resource(dataset: str, run_id: str, label: str | None) -> dict[str, str]:
    """The resource of every event of a run: ``recall.dataset.<name>``, with the dataset and label as labels.

    Route by dataset with an automation's ``match: {"recall.dataset": "golden*"}`` (or on the resource id).
    """
    return {
        "prefect.resource.id": f"recall.dataset.{dataset}",
        "prefect.resource.name": dataset,
        "recall.dataset": dataset,
        "recall.label": label or "",
        "recall.run_id": run_id,
    }


def _clip(text: Any, limit: int = CLIP) -> str | None:
    if text is None:
        return None
    value = redact(str(text))
    return value if len(value) <= limit else value[:limit] + "…"


def _ci(lo: float | None, hi: float | None) -> str:
    return f"95 % CI {fmt_number(lo, '.3f')}..{fmt_number(hi, '.3f')}"


def _segments(comparison: Comparison | None) -> list[dict[str, Any]]:
    """The segments whose mean moved most (either way), largest change first."""
    if comparison is None:
        return []
    moved = [s for s in comparison.segments if s.mean_delta is not None]
    moved.sort(key=lambda s: -abs(s.mean_delta or 0.0))
    return [
        {"column": s.column, "value": _clip(s.value), "n_paired": s.n_paired, "mean_delta": s.mean_delta,
         "flips_pass_to_fail": s.flips_pass_to_fail, "verdict": s.verdict}
        for s in moved[:TOP_SEGMENTS]
    ]  # fmt: skip


def _worst(comparison: Comparison | None) -> list[dict[str, Any]]:
    if comparison is None:
        return []
    return [
        {"row_id": _clip(w.row_id), "score_baseline": w.score_baseline, "score_current": w.score_current,
         "delta": w.delta, "lost": [_clip(s) for s in w.lost[:LOST_PER_ROW]]}
        for w in comparison.worst_rows[:WORST_ROWS]
    ]  # fmt: skip


def _kind(status: str, comparison: Comparison | None) -> AlertKind | None:
    if status == "failed":
        return "failed"
    if status == "budget_exhausted":
        return "budget_exhausted"
    if comparison is not None and comparison.verdict in ("regressed", "incomparable"):
        return comparison.verdict
    return None


def alert_for_run(summary: Mapping[str, Any], comparison: Comparison | None, report_uri: str | None) -> Alert | None:
    """The alert of a committed run (``summary``: its overall ``runs`` row), or None when it stays quiet."""
    kind = _kind(str(summary["status"]), comparison)
    if kind is None:
        return None
    reason = summary.get("status_reason") if kind in ("failed", "budget_exhausted") else None
    if reason is None and comparison is not None:
        reason = comparison.reason
    payload: dict[str, Any] = comparison.event_payload() if comparison is not None else {}
    payload.update(
        {
            "kind": kind,
            "run_id": summary["run_id"],
            "flow_run_id": summary.get("flow_run_id"),
            "dataset": summary["dataset"],
            "dataset_uri": _clip(summary.get("dataset_uri"), 1000),
            "label": summary.get("label"),
            "index_version": summary.get("index_version"),
            "metric": summary.get("metric"),
            "judge": summary.get("judge"),
            "judge_model": summary.get("judge_model"),
            "status": summary["status"],
            "reason": _clip(reason, 1000),
            "rows": summary.get("rows"),
            "scored": summary.get("scored"),
            "errors": summary.get("errors"),
            "skipped": summary.get("skipped"),
            "not_judged": summary.get("not_judged"),
            "error_rate": summary.get("error_rate"),
            "top_error": _clip(summary.get("top_error")),
            "top_error_count": summary.get("top_error_count"),
            "requests": summary.get("requests"),
            "cost_usd": summary.get("cost_usd"),
            "mean": summary.get("mean_score"),
            "mean_ci": [summary.get("ci_low"), summary.get("ci_high")],
            "threshold": summary.get("threshold"),
            "baseline": None
            if comparison is None
            else {
                "run_id": comparison.baseline_run_id,
                "mean": comparison.baseline_run_mean,
                "mean_ci": list(comparison.baseline_run_ci),
            },
            "segments": _segments(comparison),
            "worst_rows": _worst(comparison),
            "report_uri": report_uri,
        }
    )
    payload["subject"], payload["message"] = render(payload)
    return Alert(kind, ALERT_EVENTS[kind], alert_resource(summary["dataset"], summary["run_id"], summary.get("label")),
                 payload)  # fmt: skip


def alert_for_worker_death(dataset: str, run_id: str, label: str | None, dataset_uri: str, reason: str) -> Alert:
    """The alert of a run whose worker process died: nothing was committed (the same command resumes it)."""
    payload: dict[str, Any] = {
        "kind": "failed", "run_id": run_id, "dataset": dataset, "dataset_uri": _clip(dataset_uri, 1000),
        "label": label, "status": "failed", "reason": _clip(reason, 1000), "committed": False,
        "segments": [], "worst_rows": [], "baseline": None, "report_uri": None,
    }  # fmt: skip
    payload["subject"], payload["message"] = render(payload)
    return Alert("failed", ALERT_EVENTS["failed"], alert_resource(dataset, run_id, label), payload)


def _drift_block(canary: Mapping[str, Any]) -> str:
    """What the canary said in both runs: each figure with its interval, and the change that moved."""
    cur, base = canary.get("current") or {}, canary.get("baseline") or {}

    def fig(side: Mapping[str, Any], name: str) -> str:
        value, lo, hi = (side.get(name) or [None, None, None])[:3]
        return f"{fmt_number(value, '.3f')} ({_ci(lo, hi)})"

    moved = [
        f"- {m['name']}: baseline {fig(base, m['name'])} → this run {fig(cur, m['name'])}; change "
        f"{fmt_number(m.get('delta'), '+.3f')}"
        + (f" (95 % CI {fmt_number(m.get('low'), '+.3f')}..{fmt_number(m.get('high'), '+.3f')})" if m.get("low")
           is not None else "")
        + (", beyond its interval" if m.get("differs") else "")
        for m in canary.get("changes") or []
    ]  # fmt: skip
    return "\n".join(
        [
            f"Judge drift: the judge's agreement with the canary's labels ({cur.get('rows')} rows, "
            f"{cur.get('units')} units) moved, so the scores are not compared (a change could be the judge's, "
            "not the retriever's):",
            *moved,
        ]
    )


def render(p: Mapping[str, Any]) -> tuple[str, str]:
    """The subject (one line) and the CommonMark message of an alert payload; every dataset value escaped.

    The message is paragraphs and lists separated by blank lines (a chat tool shows the blank lines, a Markdown
    viewer the paragraphs).
    """
    kind: AlertKind = p["kind"]
    label = f" (label {md_text(p['label'])})" if p.get("label") else ""
    title = TITLES[kind] + (" (judge drift)" if kind == "incomparable" and p.get("judge_drift") else "")
    subject = f"{title}: {md_text(p['dataset'], 120)}{label}"
    blocks = [f"**{title.capitalize()}: {md_text(p['dataset'], 120)}**{label}"]
    if p.get("reason"):
        blocks.append(f"Reason: {md_text(p['reason'])}")
    if kind == "incomparable" and p.get("judge_drift") and p.get("canary"):
        blocks.append(_drift_block(p["canary"]))
    if kind == "failed" and p.get("top_error"):
        blocks.append(f"Most common error ({p.get('top_error_count')} rows): {md_text(p['top_error'])}")
    if p.get("committed") is False:
        blocks.append("Nothing was committed: rerun the same command to resume the run.")
    elif kind in ("failed", "budget_exhausted"):
        blocks.append(
            f"Rows {p.get('rows')}: {p.get('scored')} scored, {p.get('errors')} with an error, {p.get('skipped')} "
            f"skipped, {p.get('not_judged') or 0} not judged (error rate {fmt_number(p.get('error_rate'), '.1%')}); "
            f"{p.get('requests')} judge requests, cost ${fmt_number(p.get('cost_usd'), '.4f')}."
        )
    base = p.get("baseline")
    if p.get("mean") is not None or base:
        mean = f"Mean {fmt_number(p.get('mean'), '.3f')} ({_ci(*(p.get('mean_ci') or (None, None)))})"
        if base:
            mean += (
                f" vs baseline {fmt_number(base.get('mean'), '.3f')} ({_ci(*base['mean_ci'])}) "
                f"of run {md_code(base['run_id'])}"
            )
        blocks.append(mean + ".")
    if base and kind != "incomparable":  # an incomparable pair has no meaningful change, flips or segments
        lo, hi = p.get("ci") or (None, None)
        flips = p.get("flips") or {}
        blocks.append(
            f"Paired change {fmt_number(p.get('mean_delta'), '+.3f')} ({_ci(lo, hi)}) over {p.get('n_paired')} rows; "
            f"pass→fail flips: {flips.get('pass_to_fail', 0)} (fail→pass {flips.get('fail_to_pass', 0)})"
            + (f"; a pass is a score of at least {p['threshold']:g}." if p.get("threshold") is not None else ".")
        )
    if p.get("segments") and kind != "incomparable":
        items = [
            f"- {md_text(s['column'])} = {md_text(s['value'])}: {fmt_number(s['mean_delta'], '+.3f')} over "
            f"{s['n_paired']} rows, {s['flips_pass_to_fail']} pass→fail ({s['verdict']})"
            for s in p["segments"]
        ]
        blocks.append("\n".join(["Segments that moved most:", *items]))
    if p.get("worst_rows"):
        items = []
        for w in p["worst_rows"]:
            lost = "; ".join(f"“{md_text(s)}”" for s in w["lost"]) or "no sentence recorded"
            items.append(f"- {md_code(w['row_id'])} {w['score_baseline']:.2f} → {w['score_current']:.2f}: lost {lost}")
        blocks.append("\n".join(["Rows that lost most:", *items]))
    if p.get("report_uri"):
        blocks.append(f"Report: {md_code(p['report_uri'])}")
    blocks.append(f"Run {md_code(p['run_id'])} of {md_code(p.get('dataset_uri') or '')}")
    return subject, "\n\n".join(blocks)
