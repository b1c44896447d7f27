"""Human-readable views of a run: the summary table and a markdown report of the worst rows.

Dataset values in the markdown report are escaped (``recall_tasks.reports.markdown``): they stay text in Prefect's UI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from recall_tasks.judges.base import other_model
from recall_tasks.reports.markdown import md_code, md_text
from recall_tasks.summaries import RunSummary

if TYPE_CHECKING:
    from recall_tasks.reports.run_data import RunRows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_rows(summary: RunSummary) -> list[dict[str, str]]:
    """The run summary as two-column rows (Prefect table artifact, CLI table).

    ``threshold`` follows ``pass_rate``: a pass is a score at or above it, and a pass rate means nothing without it.
    A ``retrieval_ids`` run's pass rate is named ``hit_rate@k`` (a row passes when a relevant id is in its top k,
    whatever the threshold, which is not shown); a run with document ids shows its mean recall, nDCG and MRR at
    every k after it.
    """
    keys = [
        "run_id",
        "status",
        "dataset",
        "label",
        "metric",
        "judge_model",
        "rows",
        "scored",
        "errors",
        "skipped",
        "not_judged",
        "cached",
        "mean_score",
        "ci_low",
        "ci_high",
        "median_score",
        "p10_score",
        "pass_rate",
        "threshold",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "wall_seconds",
    ]
    if summary.get("metric") == "retrieval_ids":  # success is "a relevant id in the top k": no threshold applies
        keys.remove("threshold")
    rows = [{"field": _field_name(summary, k), "value": _fmt(summary.get(k))} for k in keys]
    replied = substitution(summary)
    if replied is not None:  # judge_model is the model asked for: say who answered
        rows[keys.index("judge_model")]["value"] += f" (asked; {replied[0]} rows answered by {replied[1]})"
    at = keys.index("pass_rate") + 1
    rows[at:at] = id_metric_rows(summary)
    if summary.get("canary_id"):
        rows.append({"field": "canary", "value": canary_text(summary)})
    return rows


def substitution(summary: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(rows, "llama-3-8b-instruct")`` when replies from another model than the one asked for judged rows (a
    gateway's fallback: ``runs.substituted_rows``, the other ``reply_models``); None when every reply was its own."""
    rows = summary.get("substituted_rows") or 0
    if not rows:
        return None
    asked = str(summary.get("judge_model") or "")
    others = [m for m in summary.get("reply_models") or [] if other_model(asked, m)]
    return int(rows), ", ".join(others) or "another model"


#: The id metrics the summary shows, one row per family (every k of ``--k``); the rest are in ``results.id_metrics``.
ID_FAMILIES = ("recall", "ndcg", "mrr")


def _field_name(summary: Mapping[str, Any], key: str) -> str:
    """A summary field's name; a ``retrieval_ids`` run's pass rate is what its ``success`` counts: hit_rate@k."""
    if key == "pass_rate" and summary.get("metric") == "retrieval_ids":
        return "hit_rate@" + str(summary.get("verdict_metric") or "recall@10").rpartition("@")[2]
    return key


def id_metric_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """``recall@1/5/10  0.5 / 0.8 / 0.95``: the run's mean id metrics (a run with document ids), one row a family."""
    means = summary.get("id_metrics") or {}
    rows = []
    for family in ID_FAMILIES:
        ks = sorted((int(k) for name in means for f, _, k in [name.partition("@")] if f == family and k.isdigit()))
        if ks:
            values = " / ".join(_fmt(means[f"{family}@{k}"]) for k in ks)
            rows.append({"field": f"{family}@{'/'.join(map(str, ks))}", "value": values})
    return rows


def canary_text(summary: Mapping[str, Any]) -> str:
    """``accuracy 0.950 (95 % CI 0.930..0.970), kappa 0.880 (0.840..0.920) over 40 rows, 180 units (0 cached)``;
    ``not checked: none of its 40 rows got a verdict`` when there is nothing to measure (a budget stopped first)."""
    errors = summary.get("canary_errors")
    if not summary.get("canary_rows") and errors:
        return f"not checked: none of its {errors} rows got a verdict"

    def fig(name: str) -> str:
        value, lo, hi = (summary.get(f"canary_{name}{s}") for s in ("", "_low", "_high"))
        if value is None:
            return f"{name} n/a"
        if lo is None or hi is None:  # too few rows for an interval
            return f"{name} {value:.3f} (no interval)"
        return f"{name} {value:.3f} ({'95 % CI ' if name == 'accuracy' else ''}{_num(lo)}..{_num(hi)})"

    text = f"{fig('accuracy')}, {fig('kappa')} over {summary.get('canary_rows')} rows, {summary.get('canary_units')} "
    text += f"units ({summary.get('canary_cached')} cached"
    return text + (f", {errors} without a verdict)" if errors else ")")


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def run_results(plan: Any, wanted: list[str] | None = None) -> RunRows | None:
    """The committed run's rows for the reports (``run_data.bounded_results``, one scan): every row's score and
    figures, whole rows for the worst, light columns for the rows of ``wanted`` ids."""
    from recall_tasks.reports.run_data import bounded_results

    ds = plan.store.read_table("results")
    return None if ds is None else bounded_results(ds, plan.run_id, wanted=wanted)


def worst_rows(plan: Any, limit: int = 10, results: RunRows | None = None) -> list[dict[str, Any]]:
    """The lowest-scoring rows of a committed run (errors first), with their unsupported statements.

    Among the worst rows ``bounded_results`` read the verdicts of (bounded memory on 1M-row runs), those with
    verdicts; ``results`` is ``run_results(plan)`` when the caller already has it.
    """
    rows = run_results(plan) if results is None else results
    if rows is None or "verdicts" not in rows.worst.column_names:
        return []
    import pyarrow.compute as pc  # here: the CLI imports this module at start, before any table is read

    table = rows.worst.filter(pc.is_valid(rows.worst.column("verdicts")))  # already worst first
    out = []
    for row in table.slice(0, limit).to_pylist():
        missing = [v["statement"] for v in row["verdicts"] or [] if v["verdict"] == "no"]
        out.append({**row, "missing": missing})
    return out


def markdown_report(plan: Any, summary: RunSummary, limit: int = 10, results: RunRows | None = None) -> str:
    """Markdown: headline figures, then the worst rows and the sentences their context lacks."""
    lines = [
        f"# Contextual recall run {md_code(summary['run_id'])}",
        "",
        f"Dataset **{md_text(summary['dataset'])}** ({md_code(summary['dataset_uri'])}), metric "
        f"{md_text(summary['metric'])}, judge {md_text(summary['judge_model'])} (prompt "
        f"{md_text(summary['prompt_version'])}).",
        "",
        f"- mean score **{_fmt(summary['mean_score'])}** (95 % CI {_fmt(summary['ci_low'])}–"
        f"{_fmt(summary['ci_high'])}), pass rate {_fmt(summary['pass_rate'])} at threshold {summary['threshold']}",
        f"- rows {summary['rows']}: scored {summary['scored']}, errors {summary['errors']}, "
        f"skipped {summary['skipped']}, not judged {summary.get('not_judged') or 0}, cached {summary['cached']}",
        f"- judge requests {summary['requests']}, tokens {summary['prompt_tokens']}+{summary['completion_tokens']}, "
        f"cost ${summary['cost_usd']:.4f}",
        "",
        "## Worst rows",
        "",
        "| row_id | score | missing sentences / error |",
        "|---|---|---|",
    ]
    for row in worst_rows(plan, limit, results):
        detail = row["error"] or "; ".join(f"“{s}”" for s in row["missing"]) or "-"
        lines.append(f"| {md_code(row['row_id'], 200, table=True)} | {_fmt(row['score'])} | {md_text(detail, 400)} |")
    return "\n".join(lines)
