"""The OpenAI judge's Batch API side and its claim extraction: mixins of :class:`~recall_tasks.judges.openai_judge.
OpenAIJudge`, split from it by responsibility.

Both send what the judge's live path sends, through its own completion loop (:class:`JudgeCore`: the members of
the judge they use, which mypy checks ``OpenAIJudge`` has): a batch line's body is byte for byte the first live
request's, and an unusable batch reply is repaired live; a claim extraction is one live completion.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from recall_tasks.judges import _openai_wire as wire
from recall_tasks.judges import prompts
from recall_tasks.judges._openai_attempts import counted_attempts
from recall_tasks.judges.base import JudgeRequest, JudgeResponse
from recall_tasks.judges.claims import ClaimsReply, ClaimsRetry
from recall_tasks.judges.parsing import ParseError, parse_claims
from recall_tasks.judges.pricing import BATCH_PRICE_FACTOR

if TYPE_CHECKING:
    from recall_tasks.judges._openai_http import _LoopState
    from recall_tasks.judges.batch import BatchClient


class JudgeCore(Protocol):
    """What the mixins use of the judge: its model, prompts, client per loop, completion loop and costs."""

    _model: str
    _prompt_version: str
    temperature: float | None

    def _state(self) -> _LoopState: ...

    def _request_kwargs(
        self, msgs: list[dict[str, str]], budget: int, schema: tuple[str, dict[str, Any]] = wire.VERDICTS
    ) -> dict[str, Any]: ...

    def _complete(
        self,
        state: _LoopState,
        msgs: list[dict[str, str]],
        budget: int,
        usage: list[int],
        schema: tuple[str, dict[str, Any]] = wire.VERDICTS,
        models: list[str] | None = None,
    ) -> Awaitable[str]: ...

    def _cost(self, usage: list[int], factor: float = 1.0) -> float | None: ...

    def _billed_on_failure(self, usage: list[int]) -> contextlib.AbstractContextManager[None]: ...

    def _translate(self, exc: Exception) -> Exception: ...


class BatchMixin:
    """The Batch API (see :mod:`recall_tasks.judges.batch` and :mod:`recall_tasks.pipeline.batch`)."""

    def batch_body(self: JudgeCore, request: JudgeRequest) -> dict[str, Any]:
        """The request body :meth:`judge` would send first for ``request``: a batch line's ``body``, byte for byte."""
        return self._request_kwargs(prompts.messages(request, self._prompt_version), wire.verdict_budget(request))

    def batch_client(self: JudgeCore) -> BatchClient:
        """The Batch API (files and batches) on this judge's client of the running loop."""
        from recall_tasks.judges.batch import BatchClient

        return BatchClient(self._state().client, self._translate)

    async def finish_batch_reply(
        self: JudgeCore, request: JudgeRequest, content: str, finish_reason: str | None, batch_usage: tuple[int, int]
    ) -> JudgeResponse:
        """A batch line's reply as :meth:`judge` would have made it: tolerant parsing and, for an unusable reply,
        one live repair request (a truncated reply: one live request with twice the budget, as live).

        Batch tokens cost :data:`BATCH_PRICE_FACTOR` of the live price, live repair tokens the live price.
        """
        state = self._state()
        msgs = prompts.messages(request, self._prompt_version)
        budget = wire.verdict_budget(request)
        usage = [0, 0]
        with counted_attempts(already=1) as counter:  # the batch line was the first request
            async with state.semaphore:
                if finish_reason == "length":
                    content = await self._complete(state, msgs, budget * 2, usage)
                parsed = await wire.parse_or_repair(
                    request, msgs, content, self._model, lambda repair: self._complete(state, repair, budget, usage)
                )
        batch_cost, live_cost = self._cost(list(batch_usage), BATCH_PRICE_FACTOR), self._cost(usage)
        cost = None if batch_cost is None or live_cost is None else batch_cost + live_cost
        total = [batch_usage[0] + usage[0], batch_usage[1] + usage[1]]
        return wire.verdict_response(
            request, parsed, total, 1 + counter[0], cost, model=self._model, prompt_version=self._prompt_version
        )


class ClaimsMixin:
    """Claim extraction: the claims units of contextual recall (:mod:`recall_tasks.judges.claims`)."""

    @property
    def claims_prompt_version(self) -> str:
        return prompts.CLAIMS_PROMPT_VERSION

    def claims_config(self: JudgeCore) -> dict[str, Any]:
        """What changes extracted claims: part of the metric's fingerprint. No key, no endpoint."""
        return {
            "extractor": "openai",
            "model": self._model,
            "prompt_version": prompts.CLAIMS_PROMPT_VERSION,
            "temperature": self.temperature,
        }

    async def extract_claims(self: JudgeCore, reference: str, retry: ClaimsRetry | None = None) -> ClaimsReply:
        """One request: the reference's atomic claims (``{"claims": [...]}``); an unreadable reply sets ``problem``."""
        state = self._state()
        if retry is None:
            msgs = prompts.claims_messages(reference)
        else:
            msgs = prompts.claims_messages(reference, previous=retry.previous, problem=retry.problem, limit=retry.limit)
        budget = 128 + len(reference) // 2
        usage = [0, 0]
        with self._billed_on_failure(usage), counted_attempts() as counter:
            async with state.semaphore:
                content = await self._complete(state, msgs, budget, usage, wire.CLAIMS)
        try:
            claims, problem = parse_claims(content), None
        except ParseError as exc:
            claims, problem = [], str(exc)
        return ClaimsReply(
            claims=claims, problem=problem, raw=content[:4000], model=self._model,
            prompt_version=prompts.CLAIMS_PROMPT_VERSION, prompt_tokens=usage[0], completion_tokens=usage[1],
            cost_usd=self._cost(usage), requests=counter[0],
        )  # fmt: skip
