"""A run's outcome: its status, the reason, its error rate and most common error (``commit.commit_run`` records it).

In this order, the first that applies:

- ``failed`` when judging was stopped by an outage (the circuit breaker): the tables are still committed
  (nothing lost, the errored rows visible), a failed run is never a baseline, and the flow then raises
  :class:`~recall_tasks.errors.RunFailed` (CLI exit 4);
- ``budget_exhausted`` when ``--max-requests`` / ``--max-cost-usd`` stopped judging, whatever the error rate of
  the rows it judged (a partial run's rate says little: the rows that fail before the judge, such as missing
  inputs, are all there, the judged ones only partly). The reason names the limit, how many rows were not judged
  and, when above ``--max-error-rate``, the error rate. Committed; the flow then raises
  :class:`~recall_tasks.errors.BudgetExhausted` (CLI exit 5). Only an explicit ``--baseline RUN_ID`` takes such
  a run as a baseline;
- ``failed`` when more than ``max_error_rate`` of the assessed rows ended with an error;
- ``completed`` otherwise; a regressed run is a completed run (the verdict is separate, see ``tracking``).

The error rate is ``errors / assessed``: assessed rows are the rows minus those ``--on-missing skip`` did not
assess and those a budget or an outage kept from the judge (``not_judged``), i.e. the rows judged or failed on
their inputs. It is recorded whatever the status.
"""

from __future__ import annotations

from typing import Any


def run_outcome(plan: Any, top_error: tuple[str | None, int], stats: dict[str, Any]) -> dict[str, Any]:
    """Status, reason, error rate and dominant error of a run (see the module docstring for the rules).

    ``plan``: the run's ``steps.RunPlan`` (its parameters, budget and circuit breaker are read); ``top_error``:
    the most frequent error text of the run's rows and how many have it (``RunTally.dominant_error``); ``stats``:
    the run's aggregates (``RunTally.stats``).
    """
    not_judged = stats.get("not_judged") or 0
    assessed = stats["rows"] - stats["skipped"] - not_judged
    rate = stats["errors"] / assessed if assessed else 0.0
    top, top_count = top_error
    limit = plan.params.max_error_rate
    budget_reason = plan.budget.exhausted_reason if plan.budget else None
    breaker = getattr(plan, "breaker", None)
    breaker_reason = getattr(breaker, "tripped_reason", None)
    errors = (
        f"{stats['errors']} of {assessed} assessed rows ended with an error ({rate:.1%}, above "
        f"--max-error-rate {limit:g})"
    )
    status, reason = "completed", None
    if breaker_reason:
        status, reason = "failed", breaker_reason
    elif budget_reason:
        status = "budget_exhausted"
        reason = f"{budget_reason}: {not_judged} of {stats['rows']} rows not judged"
        if rate > limit:  # reported, but a partial run's error rate is no reason to call it failed
            reason += f"; {errors}"
    elif rate > limit:
        status, reason = "failed", errors
    return {
        "status": status, "status_reason": reason, "error_rate": rate, "max_error_rate": limit,
        "top_error": top, "top_error_count": top_count,
    }  # fmt: skip
