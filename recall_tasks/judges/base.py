"""The judge contract shared by every judge.

A judge receives one request per case: numbered *statements* to decide (expected-output sentences for
contextual recall, context items for context coverage) and numbered *evidence* (context chunks for recall,
answer sentences for coverage). It answers one verdict per statement, naming the evidence numbers that
support it. The metric, not the judge, counts and scores, so the denominator never depends on the judge.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
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
    #: the model the endpoint's reply named (None: not said, or a judge without one); ``substituted``: it is another
    #: model than the one asked for (:func:`other_model`): such a response is never cached
    reply_model: str | None = None
    substituted: bool = False
    #: row-cache entries only: the run attempt that paid for it (``io/cache.RowVerdictCache.owed``); never dumped
    paid_by: str | None = Field(None, exclude=True)


#: How the flag of a row judged by a reply from another model than the one asked for starts.
SUBSTITUTED_FLAG = "replied by model "

_DATED = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})$")


def model_family(name: str) -> str:
    """A model name without the provider's snapshot date (``gpt-4o-mini-2024-07-18``, ``gpt-4-0613``)."""
    return _DATED.sub("", name)


def other_model(asked: str, replied: str | None) -> bool:
    """Whether a reply naming ``replied`` came from another model than ``asked``: a gateway's fallback, not a dated
    snapshot of the model asked for (``gpt-4o-mini`` answered by ``gpt-4o-mini-2024-07-18``). None: not said."""
    return replied is not None and replied != asked and model_family(replied) != model_family(asked)


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


class BudgetReached(BaseException):
    """The run's ``--max-requests`` / ``--max-cost-usd`` cannot pay for the next HTTP attempt: it is not sent.

    A ``BaseException`` so that nothing between the gate and ``score_rows`` (the SDK's retries, a judge's
    ``except Exception``) takes it for a failed attempt; ``score_rows`` records the row "not judged".
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AttemptGate(Protocol):
    """The run's budget for one judge call: every HTTP attempt it sends (retries, repairs, truncation retries
    included) is reserved before it goes out, at its worst case, and settled at what its reply cost.

    The judge :meth:`arm` s it with the worst case of the completion it is about to post; each attempt of that
    completion then awaits :meth:`reserve_attempt` (raises :class:`BudgetReached`); the judge :meth:`settle` s it
    once the completion returned (its replies' cost) or failed (0.0: a failed attempt bills nothing).
    :attr:`reserves_cost`: whether the worst case is used (a cost cap); without one the judge need not price it.
    """

    reserves_cost: bool

    def arm(self, worst_usd: float) -> None: ...

    async def reserve_attempt(self) -> None: ...

    def settle(self, cost_usd: float) -> None: ...


#: The budget gate of the judge call running in this context (set by ``score_rows`` around each call).
attempt_gate: contextvars.ContextVar[AttemptGate | None] = contextvars.ContextVar("attempt_gate", default=None)


@dataclass(frozen=True)
class Spend:
    """What calls to the judge endpoint cost: HTTP attempts (retries included), tokens billed, USD (None: a model
    without a price). The run's ``requests``/``prompt_tokens``/``completion_tokens``/``cost_usd`` are sums of it."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0

    def __add__(self, other: Spend) -> Spend:
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return Spend(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            cost,
        )


def charge(exc: BaseException, spend: Spend) -> None:
    """Add ``spend`` to what a failed call's exception carries (``requests``: its attempts, set by the judge).

    Why: a call that fails after paid replies (a reply truncated twice, an extraction whose retry failed, a row
    whose claims were extracted but that was never judged) was paid for all the same; the row it fails records
    what the exception carries, so the runs table sums every request the endpoint billed.
    """
    total = spend_of(exc) + spend
    exc.requests, exc.prompt_tokens = total.requests, total.prompt_tokens  # type: ignore[attr-defined]
    exc.completion_tokens, exc.cost_usd = total.completion_tokens, total.cost_usd  # type: ignore[attr-defined]


def spend_of(exc: BaseException) -> Spend:
    """What ``exc`` carries (nothing for an exception no judge call raised)."""
    return Spend(
        int(getattr(exc, "requests", 0) or 0),
        int(getattr(exc, "prompt_tokens", 0) or 0),
        int(getattr(exc, "completion_tokens", 0) or 0),
        getattr(exc, "cost_usd", 0.0),
    )


def take_spend(exc: BaseException) -> Spend:
    """:func:`spend_of`, once: the exception then carries nothing, so that the other rows sharing it (a claim
    extraction failed for a reference several rows have) do not count the same requests again."""
    spent = spend_of(exc)
    charge(exc, Spend(-spent.requests, -spent.prompt_tokens, -spent.completion_tokens, 0.0))
    exc.cost_usd = 0.0  # type: ignore[attr-defined]
    return spent
