"""What a judge can do beyond :class:`~recall_tasks.judges.base.Judge`: one ``runtime_checkable`` protocol each.

The pipeline asks ``isinstance(judge, Priced)`` instead of probing an attribute named in a string, so mypy checks
every use of a capability, and a judge that loses one (a rename) fails the conformance check beside it
(``openai_judge._conforms``) and the tests, instead of silently changing what a run does (an unpriced model that
``--max-cost-usd`` no longer refuses). Each protocol holds what one check reads, no more: a judge (or a test's
fake) that has one capability does not need the others. docs/design.md, "Judge capabilities", says who implements
and who checks which.

A wrapper judge (``pipeline.batch.finish.BatchServedJudge``) forwards what it wraps member by member, never with a
catch-all attribute hook (from Python 3.12 ``isinstance`` reads protocol members statically: such a forward would
stop matching).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from recall_tasks.errors import ConfigError
from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse

if TYPE_CHECKING:
    from recall_tasks.judges.batch import BatchClient
    from recall_tasks.judges.ratelimit import GrantSource


@runtime_checkable
class Preflighted(Protocol):
    """Probes its endpoint with one cheap request before a run (``check_run``, ``calibrate``)."""

    def preflight(self) -> str | None:
        """A note to show (None: nothing to say); raises a ``JudgeConfigError`` for an endpoint that cannot serve."""
        ...


@runtime_checkable
class Closable(Protocol):
    """Holds HTTP clients to close once the run is over (``release_judge``)."""

    async def aclose(self) -> None: ...


@runtime_checkable
class Priced(Protocol):
    """Knows the price of models (USD per million input and output tokens): ``--max-cost-usd``, ``--dry-run``."""

    @property
    def prices(self) -> Mapping[str, tuple[float, float]]: ...


@runtime_checkable
class CostBounded(Protocol):
    """Knows the worst case of its smallest request: a cost cap below it could pay for none (``check_priced``)."""

    def least_worst_cost(self) -> tuple[float, int, int]:
        """(USD, prompt bytes, completion limit)."""
        ...


@runtime_checkable
class AttemptGated(Protocol):
    """``gates_attempts``: each HTTP attempt reserves the run's budget as it is sent (``judges.base.AttemptGate``),
    so the scoring loop reserves a call's first attempt only."""

    @property
    def gates_attempts(self) -> bool: ...


@runtime_checkable
class SharesLimits(Protocol):
    """Takes ``--rpm``/``--tpm`` grants from fleet-wide sources too (``fleet.rate.share_limits``), keyed by its
    endpoint's URL."""

    @property
    def model(self) -> str: ...

    @property
    def base_url(self) -> str | None: ...

    def share_limits(self, rpm: tuple[GrantSource, int] | None, tpm: tuple[GrantSource, int] | None) -> None: ...


@runtime_checkable
class Batching(Protocol):
    """Judges through the Batch API (``--batch``, ``pipeline.batch``): the bodies it would send live, a client for
    files and batches, and a batch line's reply finished as a live reply would be."""

    @property
    def model(self) -> str: ...

    @property
    def endpoint(self) -> str:
        """``host[:port]`` of the endpoint (never credentials or paths)."""
        ...

    def batch_body(self, request: JudgeRequest) -> dict[str, Any]: ...

    def batch_client(self) -> BatchClient: ...

    async def finish_batch_reply(
        self, request: JudgeRequest, content: str, finish_reason: str | None, batch_usage: tuple[int, int]
    ) -> JudgeResponse: ...


@runtime_checkable
class Prepaid(Protocol):
    """Serves some requests already paid for (a collected batch's answers): the run's budget never holds them."""

    def prepaid(self, request: JudgeRequest) -> bool: ...


def gates_attempts(judge: object) -> bool:
    """Whether ``judge`` reserves the run's budget per HTTP attempt itself (:class:`AttemptGated`)."""
    return isinstance(judge, AttemptGated) and bool(judge.gates_attempts)


def prices_of(judge: object) -> Mapping[str, tuple[float, float]]:
    """``judge``'s prices (none for a judge without: the lexical judge costs nothing)."""
    return judge.prices if isinstance(judge, Priced) else {}


def batching(judge: object) -> Batching:
    """``judge`` as a :class:`Batching` judge (``check_batch`` refused the run otherwise)."""
    if not isinstance(judge, Batching):
        raise ConfigError("--batch needs a judge with a Batch API client (--judge openai)")
    return judge


@runtime_checkable
class FullJudge(Judge, Preflighted, Closable, Priced, CostBounded, AttemptGated, SharesLimits, Batching, Protocol):
    """A judge with every capability above (``OpenAIJudge``): what a wrapper that forwards them all wraps."""


def full_judge(judge: object) -> FullJudge:
    """``judge`` as a :class:`FullJudge` (a ``--batch`` run's judge: ``check_batch`` refused any other)."""
    if not isinstance(judge, FullJudge):
        raise ConfigError("--batch needs a judge with a Batch API client (--judge openai)")
    return judge
