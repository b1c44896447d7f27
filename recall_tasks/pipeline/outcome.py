"""A run's outcome: its status, the reason, its error rate and most common error (``commit.commit_run`` records it).

- ``failed`` when more than ``max_error_rate`` of the assessed rows (rows minus those not assessed under
  ``on_missing=skip``) ended with an error, or when judging was stopped by an outage: the tables are still
  committed (nothing lost, the errored rows visible), a failed run is never a baseline, and the flow then
  raises :class:`~recall_tasks.errors.RunFailed` (CLI exit 4);
- ``budget_exhausted`` when ``--max-requests`` / ``--max-cost-usd`` stopped judging;
- ``completed`` otherwise; a regressed run is a completed run (the verdict is separate, see ``tracking``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def dominant_error(table: pa.Table) -> tuple[str | None, int]:
    """The most frequent error text of a run's rows and how many rows have it."""
    errors = table.column("error").drop_null()
    if len(errors) == 0:
        return None, 0
    top = pc.value_counts(errors).to_pylist()
    best = max(top, key=lambda item: item["counts"])
    return str(best["values"]), int(best["counts"])


def run_outcome(plan: Any, table: pa.Table, stats: dict[str, Any]) -> dict[str, Any]:
    """Status, reason, error rate and dominant error of a run (see the module docstring for the rules).

    ``plan``: the run's ``steps.RunPlan`` (its parameters, budget and circuit breaker are read); ``table``: the
    run's rows (their ``error`` column); ``stats``: ``aggregates.summarize`` of them.
    """
    assessed = stats["rows"] - stats["skipped"]
    rate = stats["errors"] / assessed if assessed else 0.0
    top, top_count = dominant_error(table)
    limit = plan.params.max_error_rate
    budget_reason = plan.budget.exhausted_reason if plan.budget else None
    breaker = getattr(plan, "breaker", None)
    breaker_reason = getattr(breaker, "tripped_reason", None)
    status, reason = "completed", None
    if breaker_reason:
        status, reason = "failed", breaker_reason
    elif rate > limit:
        status = "failed"
        reason = (
            f"{stats['errors']} of {assessed} assessed rows ended with an error ({rate:.1%}, above "
            f"--max-error-rate {limit:g})"
        )
    elif budget_reason:
        status, reason = "budget_exhausted", budget_reason
    return {
        "status": status, "status_reason": reason, "error_rate": rate, "max_error_rate": limit,
        "top_error": top, "top_error_count": top_count,
    }  # fmt: skip
