"""The canary of a run (``--canary LABELS``): a small labelled set judged with every run, its agreement recorded.

- **Checked before anything is judged** (:func:`open_canary`, from ``steps.check_run``): the labelled set is read
  and validated (``io/labels.load_labels``: one ``error:`` line naming the file, row and column), and must suit the
  run (its rows' task is the run's metric, units are sentences, at least one row has unit labels).
- **Judged as any row** (:func:`score_canary`, at the commit): the canary's rows go through
  ``scoring.score_rows`` with the run's metric, judge, row verdict cache, budget and circuit breaker; its requests
  and cost are counted in the run's (``runs.requests``/``cost_usd`` include ``canary_requests``/``canary_cost_usd``).
  The canary's rows never enter the ``results`` table nor the run's scores and aggregates: only its figures are
  recorded, on the run's overall ``runs`` row (``io/schemas.CANARY_FIELDS``).
- **Cached, but never stale against the run**: the canary is served from the row cache when the run itself judged
  nothing afresh (every row from the caches: an unchanged judge re-judges nothing, a changed model changes the
  cache key). When the run judged rows afresh, the canary is re-judged too (its cache entries rewritten): its
  agreement must describe the judge that produced tonight's fresh verdicts, and a provider can change a model
  behind a fixed name, which no cache key can see.

The agreement figures are ``analysis/agreement.agreement`` over the canary's rows (units paired with their
labels); the per-row unit counts are kept (``canary_detail``) so the judge-drift check can pair two runs' canaries
row by row (``analysis/drift.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recall_tasks._sync import run_sync
from recall_tasks.analysis.agreement import PairedRow, agreement
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, DatasetError, StorageError
from recall_tasks.io.labels import LabelledRow, LabelledSet, load_labels
from recall_tasks.io.schemas import CANARY_FIELDS
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.base import JudgeResponse
from recall_tasks.pipeline.results_table import RowOutcome
from recall_tasks.pipeline.scoring import RowCache, score_rows

if TYPE_CHECKING:
    from recall_tasks.fleet.budget import FleetBudget

__all__ = ["Canary", "canary_columns", "no_canary", "open_canary", "score_canary"]


@dataclass(frozen=True)
class Canary:
    """A validated canary: the labelled set and the rows of it that carry unit labels."""

    labels: LabelledSet
    rows: list[LabelledRow]

    @property
    def digest(self) -> str:
        return f"sha256:{self.labels.fingerprint}"


def open_canary(params: RunParams, storage: StorageConfig) -> Canary | None:
    """The run's canary, read and checked before any judge call (None without ``--canary``); ConfigError if unfit."""
    if not params.canary:
        return None
    if params.units != "sentences":
        raise ConfigError(
            "--canary needs --units sentences: its labels belong to the reference's sentences, which --units claims "
            "does not judge"
        )
    try:
        labels = load_labels(params.canary, storage, params.metric, params.columns)
    except (DatasetError, StorageError) as exc:
        raise ConfigError(f"--canary: {exc}") from None
    other = next((r for r in labels.rows if r.task != params.metric), None)
    if other is not None:
        raise ConfigError(
            f"--canary {params.canary}: row {other.index} is labelled for {other.task}, but this run measures "
            f"{params.metric}: a canary judges the run's own metric"
        )
    rows = [r for r in labels.rows if r.labels]
    if not rows:
        raise ConfigError(
            f"--canary {params.canary}: no row has unit labels (a labels column); a canary measures unit agreement, "
            "a row-level expected_score alone cannot"
        )
    return Canary(labels, rows)


class _WriteOnly:
    """The row cache for a canary that must be re-judged: nothing is read, fresh verdicts are written."""

    def __init__(self, inner: RowCache) -> None:
        self.inner = inner

    def get_many(self, keys: list[str]) -> dict[str, JudgeResponse]:
        return {}

    def put_many(self, entries: dict[str, JudgeResponse], *, flush: bool = True) -> bool:
        return self.inner.put_many(entries, flush=flush)

    def flush(self) -> None:
        self.inner.flush()


def no_canary() -> dict[str, Any]:
    """The canary columns of a run without one (and of every segment row): all null."""
    return {f.name: None for f in CANARY_FIELDS}


def score_canary(plan: Any, canary: Canary, *, fresh: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Judge the canary with the run's metric, cache, budget and breaker: its ``runs`` columns, and its spend
    (``requests``, ``prompt_tokens``, ``completion_tokens``, ``cost_usd``: added to the run's).

    ``fresh``: the run judged rows afresh, so the canary is re-judged (cache read bypassed, entries rewritten).
    """
    cache = plan.cache if plan.cache is None or not fresh else _WriteOnly(plan.cache)
    rows = [dict(r.row) for r in canary.rows]
    budget = _budget(plan)
    try:
        outcomes = plan.scope.run(score_rows(plan.metric, rows, cache, budget, plan.breaker))
    finally:
        if budget is not plan.budget and budget is not None:  # the canary's own share of the run's counters
            run_sync(_let_go(budget))
    if budget is not plan.budget and budget is not None and budget.exhausted_reason and plan.budget is not None:
        plan.budget.exhausted_reason = plan.budget.exhausted_reason or budget.exhausted_reason  # the run's outcome
    if plan.cache is not None:
        plan.cache.flush()
    return canary_columns(canary, outcomes)


async def _let_go(budget: FleetBudget) -> None:
    """Return what the canary's budget holds unspent to the run's counters and close its Prefect API client (left
    open, its socket was garbage-collected in a later test: found with ``RECALL_BENCH_GC_EACH_TEST=1``)."""
    try:
        await budget.give_back()
    finally:
        await budget.aclose()


def _budget(plan: Any) -> Any:
    """The run's budget: with worker processes (``--task-runner processes|dask``) its counters in Prefect, which
    the workers' chunks have drawn on (the flow process's own ``plan.budget`` counted none of their requests)."""
    if not plan.budget_counters:
        return plan.budget
    from recall_tasks.fleet import rate as fleet
    from recall_tasks.fleet.budget import FleetBudget

    url = fleet.api_url()
    if url is None:
        return plan.budget
    p = plan.params
    return FleetBudget(
        dict(plan.budget_counters), url, max_requests=p.max_requests, max_cost_usd=p.max_cost_usd,
        max_in_flight=p.max_concurrency,
    )  # fmt: skip


def _judge_verdicts(row: LabelledRow, outcome: RowOutcome) -> list[bool] | None:
    """The judge's verdict of each labelled unit, in the labels' order (None: the row got no verdicts)."""
    result = outcome.result
    if result is None or result.score is None or result.skipped or not result.verdicts:
        return None
    said = {v.statement.strip(): v.verdict == "yes" for v in result.verdicts}
    units = row.units or []
    if any(u.strip() not in said for u in units):
        return None
    return [said[u.strip()] for u in units]


def canary_columns(canary: Canary, outcomes: list[RowOutcome]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's canary columns (``CANARY_FIELDS``) from its rows' outcomes, and the canary's spend."""
    paired: list[PairedRow] = []
    detail: list[dict[str, Any]] = []
    requests = errors = cached = prompt_tokens = completion_tokens = 0
    cost = 0.0
    for row, out in zip(canary.rows, outcomes, strict=True):
        md = out.result.metadata if out.result is not None else None
        if out.cached:
            cached += 1
        else:
            requests += md.requests if md is not None and md.requests else out.requests
            cost += (md.cost_usd or 0.0) if md is not None else 0.0
            prompt_tokens += md.prompt_tokens if md is not None else 0
            completion_tokens += md.completion_tokens if md is not None else 0
        judge = _judge_verdicts(row, out)
        if judge is None:
            errors += 1
            continue
        human = list(row.labels or [])
        paired.append(PairedRow(human, judge, category=row.category, key=row.key))
        counts = {"tp": 0, "fn": 0, "fp": 0, "tn": 0}
        for h, j in zip(human, judge, strict=True):
            counts[("tp" if j else "fn") if h else ("fp" if j else "tn")] += 1
        detail.append({"key": row.key, **counts})
    columns = no_canary()
    columns.update(
        canary_id=canary.digest, canary_uri=canary.labels.uri, canary_rows=len(paired),
        canary_units=sum(len(p.human) for p in paired), canary_cached=cached, canary_errors=errors,
        canary_requests=requests, canary_cost_usd=cost, canary_detail=detail,
    )  # fmt: skip
    if paired:
        figures = agreement(paired)
        for name in ("accuracy", "kappa"):
            f = getattr(figures, name)
            columns.update({f"canary_{name}": f.value, f"canary_{name}_low": f.low, f"canary_{name}_high": f.high})
        columns.update(canary_tpr=figures.tpr.value, canary_tnr=figures.tnr.value)
    spend = {"requests": requests, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "cost_usd": cost}  # fmt: skip
    return columns, spend
