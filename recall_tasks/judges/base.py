"""The judge contract shared by every judge.

A judge receives one request per case: numbered *statements* to decide (expected-output sentences for
contextual recall, context items for context coverage) and numbered *evidence* (context chunks for recall,
answer sentences for coverage). It answers one verdict per statement, naming the evidence numbers that
support it. The metric, not the judge, counts and scores, so the denominator never depends on the judge.
"""

from __future__ import annotations

import contextvars
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from recall_tasks.models import VerdictLabel

Task = Literal["contextual_recall", "context_coverage"]


class JudgeRequest(BaseModel):
    """What a judge is asked for one case."""

    task: Task
    question: str
    statements: list[str]
    evidence: list[str]
    include_reason: bool = True


class JudgeVerdict(BaseModel):
    """One verdict as produced by a judge; ``id`` and ``chunk_ids`` are 1-based."""

    id: int
    verdict: VerdictLabel
    reason: str = ""
    chunk_ids: list[int] = Field(default_factory=list)
    flagged: str | None = None


class JudgeResponse(BaseModel):
    """A judge's answer for one case, with what it cost."""

    verdicts: list[JudgeVerdict]
    summary: str = ""
    model: str
    prompt_version: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    requests: int = 0
    flags: list[str] = Field(default_factory=list)


@runtime_checkable
class Judge(Protocol):
    """Anything that can decide statements against evidence."""

    @property
    def model(self) -> str:
        """Model name recorded in results (``lexical`` for the offline judge)."""
        ...

    @property
    def prompt_version(self) -> str:
        """Version of the prompt or algorithm; part of every cache key."""
        ...

    def config(self) -> dict[str, Any]:
        """Everything that changes verdicts (model, prompt version, parameters); never secrets."""
        ...

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        """Decide every statement of ``request``; one verdict per statement id."""
        ...


class AttemptObserver(Protocol):
    """Told about every HTTP attempt a networked judge makes (retries included); the circuit breaker is one."""

    def attempt_sent(self) -> None:
        """An attempt is about to go out (before its answer; the other two follow it)."""

    def attempt_ok(self) -> None: ...

    def attempt_failed(self, endpoint: str, cause: str, *, timed_out: bool = False) -> None: ...


#: The observer of the judge calls made in this context (set by ``score_rows`` for the tasks it starts).
attempt_observer: contextvars.ContextVar[AttemptObserver | None] = contextvars.ContextVar(
    "attempt_observer", default=None
)
