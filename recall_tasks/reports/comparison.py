"""The Markdown view of a regression comparison (the ``regression`` artifact, the tail of the run report).

Dataset values (row ids, statements, segment values, reasons) are escaped with ``recall_tasks.reports.markdown``:
they stay text in Prefect's UI. What the figures mean: docs/regression.md.
"""

from __future__ import annotations

from recall_tasks.analysis.regression import Comparison
from recall_tasks.reports.formatting import fmt_number
from recall_tasks.reports.markdown import md_code, md_text

__all__ = ["comparison_markdown"]


def _fmt_p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.2e}"


def _at(threshold: float | None) -> str:
    return f" (a pass: score ≥ {threshold:g})" if threshold is not None else ""


def comparison_markdown(c: Comparison, threshold: float | None = None) -> str:
    """A human report: verdict headline, figures, segments, worst rows with their lost statements.

    ``threshold``: the runs' pass threshold, named beside the pass→fail flips.
    """
    verdict = c.verdict.upper().replace("_", " ")
    out = [f"## {verdict}: {md_text(c.metric or 'metric')} on {md_text(c.dataset or '?')}", ""]
    out.append(f"Run {md_code(c.current_run_id)} compared with baseline {md_code(c.baseline_run_id)}.")
    if c.reason:
        out.append("")
        out.append(f"**Incomparable**: {md_text(c.reason)}")
    if c.warnings:
        out.append("")
        out.extend(f"- ⚠ {md_text(w)}" for w in c.warnings)
    out += [
        "",
        "| figure | value |",
        "|---|---|",
        f"| paired rows | {c.n_paired} |",
        f"| added / removed rows | {c.n_added} / {c.n_removed} |",
        f"| in both, unscored in one | {c.n_unpaired_unscored} |",
        f"| mean (baseline → current) | {fmt_number(c.mean_baseline, '.4f')} → {fmt_number(c.mean_current, '.4f')} |",
        f"| mean delta | {fmt_number(c.mean_delta, '+.4f')} |",
        f"| 95 % CI of delta | [{fmt_number(c.ci_low, '+.4f')}, {fmt_number(c.ci_high, '+.4f')}] |",
        f"| pass → fail / fail → pass{_at(threshold)} | {c.flips_pass_to_fail} / {c.flips_fail_to_pass} |",
        f"| McNemar exact p | {_fmt_p(c.mcnemar_p)} |",
        f"| context precision delta (secondary) | {fmt_number(c.context_precision_delta, '+.4f')} |",
        f"| tolerance / alpha | {c.tolerance:g} / {c.alpha:g} |",
    ]
    if c.segments:
        out += [
            "",
            "### Segments",
            "",
            "| column | value | paired | baseline | current | delta | 95 % CI | p→f / f→p | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in c.segments:
            value = md_text("(null)" if s.value is None else s.value, 200)
            out.append(
                f"| {md_text(s.column)} | {value} | {s.n_paired} | "
                f"{fmt_number(s.mean_baseline, '.4f')} | {fmt_number(s.mean_current, '.4f')} | "
                f"{fmt_number(s.mean_delta, '+.4f')} | "
                f"[{fmt_number(s.ci_low, '+.4f')}, {fmt_number(s.ci_high, '+.4f')}] | "
                f"{s.flips_pass_to_fail} / {s.flips_fail_to_pass} | {s.verdict} |"
            )
    if c.worst_rows:
        out += ["", "### Largest drops", ""]
        for w in c.worst_rows:
            out.append(
                f"- {md_code(w.row_id, 200)}: {fmt_number(w.score_baseline, '.3f')} → "
                f"{fmt_number(w.score_current, '.3f')} ({fmt_number(w.delta, '+.3f')})"
            )
            out.extend(f"  - lost: {md_text(statement, 400)}" for statement in w.lost)
    return "\n".join(out) + "\n"
