"""One HTTP attempt of the OpenAI judge: reserved, counted, reported, its quota rule.

Every attempt goes through the judge's httpx2 client (:func:`~recall_tasks.judges._openai_http.build_client`):
its request hook, :class:`~recall_tasks.judges._openai_http.ObservedTransport` and its response hook call the
functions here, in this order:

1. :func:`begin_attempt`: a chat-completion attempt reserves its worst case from the run's budget first
   (:class:`~recall_tasks.judges.base.AttemptGate`; ``BudgetReached``: it is not sent), then counts in the judge
   call's attempts (:func:`counted_attempts`: a failed call's exception carries them as ``exc.requests``);
2. :func:`reported_attempt`: the run's :data:`~recall_tasks.judges.base.attempt_observer` (the circuit breaker)
   is told it went out and how it ended: refused, reset, DNS and TLS failures, timeouts and 5xx are failures,
   a 429 says nothing about an outage;
3. :func:`mark_final_quota`: a 429 whose body says ``insufficient_quota`` is not retried (the SDK retries every
   429; an exhausted quota will not come back in seconds), and :func:`~recall_tasks.judges._openai_errors.
   translate_error` makes it a configuration error by the same :data:`INSUFFICIENT_QUOTA`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import httpx2

from recall_tasks.judges._openai_reply import describe_failure
from recall_tasks.judges.base import AttemptObserver, attempt_gate, attempt_observer

#: HTTP attempts of the judge call running in this context (retries included): :func:`begin_attempt` counts them.
_attempts: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("_attempts", default=None)

#: What an error body says when the account's quota is exhausted (a 429 that no retry will cure).
INSUFFICIENT_QUOTA = "insufficient_quota"


@contextlib.contextmanager
def counted_attempts(already: int = 0) -> Iterator[list[int]]:
    """Count the HTTP attempts of one judge call (``counter[0]``); a failed or cancelled call's exception carries
    them, plus ``already``, as ``exc.requests``: they count in the run's requests."""
    counter = [0]
    token = _attempts.set(counter)
    try:
        yield counter
    except BaseException as exc:
        exc.requests = already + counter[0]  # type: ignore[attr-defined]
        raise
    finally:
        _attempts.reset(token)


async def reserve_attempt() -> None:
    """Before a chat-completion attempt goes out: the run's budget pays for its worst case first
    (:class:`~recall_tasks.judges.base.AttemptGate`; raises ``BudgetReached``, the attempt is not sent)."""
    gate = attempt_gate.get()
    if gate is not None:
        await gate.reserve_attempt()


async def begin_attempt(chat: bool) -> None:
    """An HTTP attempt is about to go out: reserved first when it is a chat completion, then counted."""
    if chat:
        await reserve_attempt()
    counter = _attempts.get()
    if counter is not None:
        counter[0] += 1


class AttemptReport:
    """One attempt as the run's attempt observer hears of it (nothing without one)."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        self.observer: AttemptObserver | None = attempt_observer.get()
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        if self.observer is not None:
            self.observer.attempt_sent()

    def failed(self, exc: BaseException) -> None:
        """The attempt raised (no reply): what it means, read from the exception chain."""
        if self.observer is not None:
            cause, timed_out = describe_failure(exc, self.timeout_s)
            self.observer.attempt_failed(self.endpoint, cause, timed_out=timed_out)

    def answered(self, status: int) -> None:
        """A reply came back with ``status``: a 5xx fails, a 429 (rate limiting) says nothing, the rest succeed."""
        if self.observer is None:
            return
        if status >= 500:
            self.observer.attempt_failed(self.endpoint, f"HTTP {status}")
        elif status != 429:
            self.observer.attempt_ok()


@contextlib.contextmanager
def reported_attempt(endpoint: str, timeout_s: float) -> Iterator[AttemptReport]:
    """Report one attempt: sent now, failed if the block raises; the block reports a reply's status."""
    report = AttemptReport(endpoint, timeout_s)
    try:
        yield report
    except Exception as exc:
        report.failed(exc)
        raise


def mark_final_quota(reply: httpx2.Response) -> None:
    """A 429 for an exhausted quota is not retried: ``x-should-retry: false``, which the SDK's retry rule obeys.
    ``reply``'s body must have been read."""
    if reply.status_code == 429 and INSUFFICIENT_QUOTA.encode() in reply.content:
        reply.headers["x-should-retry"] = "false"
