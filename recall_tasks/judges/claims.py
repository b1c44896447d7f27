"""The claim-extraction contract: a reference answer in, atomic self-contained claims out (Mastra's first step).

An extractor sees ONLY the reference answer (never the question or the context), so its claims depend on the
extractor's model, its extraction prompt version and the reference text alone: exactly the key the claims cache
uses (``recall_tasks.metrics.claims``). The wire format is ``{"claims": [string, ...]}``
(:data:`recall_tasks.judges.prompts.CLAIMS_SCHEMA`); :class:`~recall_tasks.judges.openai_judge.OpenAIJudge`
implements it with one request per call (``extract_claims``).

A reply that cannot be read as claims is not an exception: it comes back as :class:`ClaimsReply` with
``problem`` set, so the caller can retry once and fall back to sentences (one policy for "unreadable" and
"readable but unusable").
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field


class ClaimsRetry(BaseModel):
    """What was wrong with the previous extraction (sent back with it on the one retry)."""

    previous: str
    problem: str
    limit: int


class ClaimsReply(BaseModel):
    """One extraction call's outcome, with what it cost."""

    claims: list[str] = Field(default_factory=list)
    problem: str | None = None  # the reply is not ``{"claims": [string, ...]}`` (the raw reply is kept)
    raw: str = ""
    model: str
    prompt_version: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    requests: int = 0


@runtime_checkable
class ClaimExtractor(Protocol):
    """Anything that can split a reference answer into claims."""

    @property
    def model(self) -> str: ...

    @property
    def claims_prompt_version(self) -> str:
        """Version of the extraction prompt, schema and checks: part of the claims cache key."""
        ...

    def claims_config(self) -> dict[str, Any]:
        """Everything that changes claims (model, prompt version, temperature); never secrets."""
        ...

    async def extract_claims(self, reference: str, retry: ClaimsRetry | None = None) -> ClaimsReply:
        """Claims of ``reference``; ``retry`` carries the previous reply and what was wrong with it."""
        ...
