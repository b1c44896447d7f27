"""``recall-bench calibrate``: a labelled set judged by one or more judges, and each judge's agreement with the labels.

The rows go through the same scoring as a run's (:func:`recall_tasks.pipeline.scoring.score_rows`): the same
judges built from the same parameters (:func:`~recall_tasks.pipeline.components.make_judge`), the same row cache
(``<output>/cache`` by default: a set calibrated twice, or labelled rows a run judged already, cost nothing the
second time), the same retries, one :class:`~recall_tasks.fleet.guards.Budget` for the whole command
(``--max-requests`` / ``--max-cost-usd`` bound all its judges together) and a circuit breaker per judge.

What is paired, and the calibration's data: :mod:`recall_tasks.analysis.calibration` (a judge that left rows
without verdicts is ``failed``, and the command exits 4). Figures and intervals: :mod:`recall_tasks.analysis.agreement`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Sequence

from recall_tasks._sync import CancelScope
from recall_tasks.analysis.agreement import Agreement, agreement, by_category
from recall_tasks.analysis.calibration import (
    Calibration,
    JudgeCalibration,
    JudgeSpec,
    new_calibration_id,
    pair_outcomes,
)
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.fleet.guards import Budget, CircuitBreaker
from recall_tasks.io.labels import LabelledRow, LabelledSet
from recall_tasks.judges.base import Judge
from recall_tasks.metrics.base import Metric
from recall_tasks.pipeline.components import make_metric
from recall_tasks.pipeline.results_table import RowOutcome
from recall_tasks.pipeline.scoring import RowCache, score_rows

__all__ = ["calibrate", "calibrate_judge", "parse_judges"]


def parse_judges(judges: Sequence[str], models: Sequence[str], default: RunParams) -> list[JudgeSpec]:
    """The judges of ``--judge`` (repeatable: ``lexical``, ``openai``, ``openai:MODEL``) and ``--model`` (repeatable).

    ``--judge openai`` takes each ``--model`` (or the default model); ``--model M`` alone means ``openai:M``;
    nothing given means the default judge (that of ``run``). The same judge twice is refused.
    """
    specs: list[JudgeSpec] = []
    plain_openai = False
    for value in judges:
        kind, sep, model = value.strip().partition(":")
        if kind == "lexical" and not sep:
            specs.append(JudgeSpec("lexical", "lexical"))
        elif kind == "openai" and model.strip():
            specs.append(JudgeSpec("openai", model.strip()))
        elif kind == "openai" and not sep:
            plain_openai = True
            specs.extend(JudgeSpec("openai", m) for m in (models or [default.model]))
        else:
            raise ConfigError(f"--judge {value!r}: expected lexical, openai or openai:MODEL")
    if models and not plain_openai:
        specs.extend(JudgeSpec("openai", m) for m in models)
    if not specs:
        specs.append(JudgeSpec(default.judge, "lexical" if default.judge == "lexical" else default.model))
    seen: set[JudgeSpec] = set()
    for s in specs:
        if s in seen:
            raise ConfigError(f"judge {s.name} given twice: each judge is calibrated once per command")
        seen.add(s)
    return specs


async def _score(
    metrics: dict[str, Metric],
    rows: Sequence[LabelledRow],
    cache: RowCache | None,
    budget: Budget,
    breaker: CircuitBreaker,
) -> list[RowOutcome]:
    """Every row scored by the metric of its task, in one go per task; outcomes in the rows' order."""
    outcomes: list[RowOutcome | None] = [None] * len(rows)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.task, []).append(i)

    async def one(task: str, idx: list[int]) -> None:
        scored = await score_rows(metrics[task], [rows[i].row for i in idx], cache, budget, breaker)
        for i, out in zip(idx, scored, strict=True):
            outcomes[i] = out

    await asyncio.gather(*(one(t, idx) for t, idx in groups.items()))
    return [o if o is not None else RowOutcome(None, "internal: row not scored") for o in outcomes]


def calibrate_judge(
    spec: JudgeSpec,
    params: RunParams,
    judge: Judge,
    labelled: LabelledSet,
    cache: RowCache | None,
    budget: Budget,
    *,
    resamples: int,
    seed: int,
) -> JudgeCalibration:
    """Judge every row of ``labelled`` with ``judge`` and measure its agreement with the labels."""
    metrics: dict[str, Metric] = {
        t: make_metric(params.model_copy(update={"metric": t}), judge) for t in labelled.tasks()
    }
    breaker = CircuitBreaker(timeout_threshold=max(3, params.max_concurrency))
    # a scope: an interrupt raised in this thread while it waits cancels the judge calls in flight at once
    outcomes = CancelScope().run(_score(metrics, labelled.rows, cache, budget, breaker))
    if cache is not None:
        cache.flush()
    paired, disagreements, left_out = pair_outcomes(labelled.rows, outcomes)
    cost: float | None = 0.0
    requests = prompt = completion = cached = 0
    for out in outcomes:
        if out.cached:
            cached += 1
            continue
        md = out.result.metadata if out.result is not None else None
        requests += (md.requests if md is not None and md.requests else out.requests) or 0
        if md is not None:
            prompt += md.prompt_tokens
            completion += md.completion_tokens
            if md.requests and md.cost_usd is None and spec.judge == "openai":
                cost = None  # an unpriced model: the cost is unknown, not 0
            elif cost is not None and md.cost_usd is not None:
                cost += md.cost_usd
    keyed = {r.key: r for r in paired}
    by_task: dict[str, Agreement] = {
        t: agreement([keyed[r.key] for r in labelled.rows if r.task == t and r.key in keyed], resamples=resamples,
                     seed=seed)
        for t in labelled.tasks()
    }  # fmt: skip
    return JudgeCalibration(
        spec=spec, judge_model=judge.model, prompt_version=judge.prompt_version,
        judge_config=json.dumps(judge.config(), sort_keys=True, default=str), rows=len(labelled.rows),
        paired=paired, overall=agreement(paired, resamples=resamples, seed=seed), by_task=by_task,
        by_category=by_category(paired, resamples=resamples, seed=seed), disagreements=disagreements,
        row_errors=left_out, requests=requests, prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost,
        cached=cached,
    )  # fmt: skip


def calibrate(
    labelled: LabelledSet,
    judges: Sequence[tuple[JudgeSpec, RunParams, Judge]],
    cache: RowCache | None,
    budget: Budget,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Calibration:
    """Calibrate each judge on ``labelled``, one after the other (they share ``cache`` and ``budget``)."""
    now = dt.datetime.now(dt.UTC)
    cal = Calibration(new_calibration_id(now), now, labelled)
    for spec, params, judge in judges:
        cal.judges.append(calibrate_judge(spec, params, judge, labelled, cache, budget, resamples=resamples, seed=seed))
    return cal
