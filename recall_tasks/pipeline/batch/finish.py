"""Finishing a collected ``--batch`` run: the collected rows served through the judge, the failed ones as row errors.

:func:`install` puts two thin wrappers on the plan: the row cache hides the collected keys and the judge serves
them (read once from the row cache), so the rows are recorded with the batch's tokens, requests and (half-price)
cost instead of as free cache hits, and no live call is made for them. Lines still unanswered after the
resubmission raise a row error naming the batch and line, or are judged live with ``--batch-fallback live``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recall_tasks.errors import JudgeResponseError
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.judges.base import JudgeRequest, JudgeResponse
from recall_tasks.judges.capabilities import FullJudge, Prepaid, full_judge
from recall_tasks.pipeline.batch.settle import Settled
from recall_tasks.pipeline.run import RunCache, RunPlan
from recall_tasks.pipeline.scoring import metric_fingerprint, request_key

if TYPE_CHECKING:
    from recall_tasks.judges.batch import BatchClient
    from recall_tasks.judges.ratelimit import GrantSource

# -- finishing the run ------------------------------------------------------------------------------------


class HideCollected:
    """The run's row cache without the keys collected from its batches (the judge below serves them)."""

    def __init__(self, inner: RunCache, collected: set[str]) -> None:
        self.inner = inner
        self.collected = collected

    @property
    def stored(self) -> int:
        return self.inner.stored

    @property
    def spilled(self) -> int:
        return self.inner.spilled

    @property
    def spill(self) -> Path:
        return self.inner.spill

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    def owed(self, key: str, response: JudgeResponse) -> bool:
        return self.inner.owed(key, response)

    def get_many(self, keys: list[str]) -> dict[str, JudgeResponse]:
        found: dict[str, JudgeResponse] = self.inner.get_many([k for k in keys if k not in self.collected])
        return found

    def put_many(self, entries: dict[str, JudgeResponse], *, flush: bool = True) -> bool:
        ready: bool = self.inner.put_many({k: v for k, v in entries.items() if k not in self.collected}, flush=flush)
        return ready


class BatchServedJudge:
    """The live judge, except for the run's batch rows: collected ones are served from memory (read once from the
    row cache, no call),
    failed ones raise a row error naming the batch and line, unless ``fallback_live``."""

    def __init__(
        self,
        live: FullJudge,
        served: dict[str, JudgeResponse],
        fingerprint: str,
        settled: Settled,
        *,
        fallback_live: bool,
    ) -> None:
        self.live = live
        self.served = served
        self.fingerprint = fingerprint
        self.settled = settled
        self.fallback_live = fallback_live
        self.billed: set[str] = set()

    @property
    def model(self) -> str:
        return str(self.live.model)

    @property
    def prompt_version(self) -> str:
        return str(self.live.prompt_version)

    def config(self) -> dict[str, Any]:
        return dict(self.live.config())

    # -- the live judge's capabilities (judges.capabilities), each forwarded by name -------------------------

    @property
    def gates_attempts(self) -> bool:
        return self.live.gates_attempts

    @property
    def prices(self) -> Mapping[str, tuple[float, float]]:
        return self.live.prices

    @property
    def base_url(self) -> str | None:
        return self.live.base_url

    @property
    def endpoint(self) -> str:
        return self.live.endpoint

    def preflight(self) -> str | None:
        return self.live.preflight()

    async def aclose(self) -> None:
        await self.live.aclose()

    def least_worst_cost(self) -> tuple[float, int, int]:
        return self.live.least_worst_cost()

    def share_limits(self, rpm: tuple[GrantSource, int] | None, tpm: tuple[GrantSource, int] | None) -> None:
        self.live.share_limits(rpm, tpm)

    def batch_body(self, request: JudgeRequest) -> dict[str, Any]:
        return self.live.batch_body(request)

    def batch_client(self) -> BatchClient:
        return self.live.batch_client()

    async def finish_batch_reply(
        self, request: JudgeRequest, content: str, finish_reason: str | None, batch_usage: tuple[int, int]
    ) -> JudgeResponse:
        return await self.live.finish_batch_reply(request, content, finish_reason, batch_usage)

    def prepaid(self, request: JudgeRequest) -> bool:
        """A collected row: paid with its batch, so the run's budget never holds it back (``scoring``)."""
        return request_key(self.fingerprint, request) in self.served

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        key = request_key(self.fingerprint, request)
        served = self.served.get(key)
        if served is not None:
            if key in self.billed:  # a duplicate row: the same batch line, its tokens and cost counted once
                return served.model_copy(update={"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
                                                 "requests": 0})  # fmt: skip
            self.billed.add(key)
            return served
        failure = self.settled.failures.get(key)
        if failure is not None and not self.fallback_live:
            raise JudgeResponseError(failure, model=self.model)
        response: JudgeResponse = await self.live.judge(request)
        return response


if TYPE_CHECKING:

    def _conforms(judge: BatchServedJudge) -> tuple[FullJudge, Prepaid]:
        """mypy: the wrapper forwards every capability of the judge it wraps, and adds its own."""
        return judge, judge


def batch_columns(settled: Settled) -> dict[str, Any]:
    """The run row's batch ids and wait (``runs.batch_ids``, ``runs.batch_wait_s``), for ``commit.commit_run``."""
    return {"batch_ids": settled.batch_ids, "batch_wait_s": settled.wait_s} if settled.batch_ids else {}


def install(plan: RunPlan, settled: Settled) -> RunPlan:
    """The plan serving the collected rows from the row cache through the judge (see the module docstring)."""
    real = plan.cache
    if not isinstance(real, RowVerdictCache) or not (settled.collected or settled.failures):
        return plan
    fingerprint = metric_fingerprint(plan.metric)
    if settled.served is not None:  # collected by this process: served from memory (also with --refresh-cache)
        served = {k: v for k, v in settled.served.items() if k in settled.collected}
    else:  # a resumed finish: one read per row group, not one per row; --refresh-cache opens a reading cache
        reader = real if real.read else RowVerdictCache(real.uri, real.storage, read=True)
        served = reader.get_many(sorted(settled.collected))
    if plan.budget is not None:  # what the batch spent counts toward --max-requests / --max-cost-usd
        plan.budget.requests += sum(r.requests for r in served.values())
        plan.budget.cost_usd += sum(r.cost_usd or 0.0 for r in served.values())
    metric = copy.copy(plan.metric)  # the same metric (claim units, thresholds) with the serving judge
    metric.judge = BatchServedJudge(
        full_judge(plan.metric.judge), served, fingerprint, settled, fallback_live=plan.params.batch_fallback == "live"
    )
    resources = plan.resources.serving(metric, HideCollected(real, settled.collected))
    return dataclasses.replace(plan, resources=resources)
