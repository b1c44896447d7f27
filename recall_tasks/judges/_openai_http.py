"""The OpenAI judge's HTTP side: its clients, one per event loop, every attempt observed, and their life cycle.

Split from :mod:`recall_tasks.judges.openai_judge` (the judge: prompts, budgets, costs; its wire format in
:mod:`~recall_tasks.judges._openai_wire`), which builds one client per event loop with :func:`build_client` and
sends every chat completion with :func:`post_chat`. Beside it: what one attempt does and means
(:mod:`~recall_tasks.judges._openai_attempts`: reserved, counted, reported to the circuit breaker, the quota
rule), a reply read whole and bounded within its deadline (:mod:`~recall_tasks.judges._openai_reply`), the
aiohttp transport (:mod:`~recall_tasks.judges._openai_transport`) and SDK errors
(:mod:`~recall_tasks.judges._openai_errors`).

- One path, on the SDK's public API: ``AsyncOpenAI(http_client=...)`` with an httpx2 client built here
  (``openai.DefaultAsyncHttpxClient``: the SDK's defaults, redirects followed), whose event hooks reserve and count
  every attempt and apply the quota rule, and whose one transport is :class:`ObservedTransport` around the
  judge's aiohttp transport: every HTTP attempt (retries and redirects included) is reported to the run's
  circuit breaker (:func:`~recall_tasks.judges._openai_attempts.reported_attempt`), and every chat-completion
  attempt has a deadline and a bounded reply. Requests, retries (Retry-After, ``x-should-retry``, jittered
  backoff) and typed errors are the SDK's. The endpoint is named by host and port only.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai

from recall_tasks.judges._openai_attempts import begin_attempt, mark_final_quota, reported_attempt
from recall_tasks.judges._openai_reply import attempt_deadline, decoded_headers, is_chat, read_reply
from recall_tasks.judges._openai_transport import AiohttpTransport, ReplyStream, env_proxy
from recall_tasks.judges.ratelimit import RateLimiter

#: Seconds a keep-alive connection may stay idle before it is closed rather than reused (httpx2's default): a load
#: balancer or NAT that forgets an idle connection (many do after a minute or a few) drops it silently (no FIN, no
#: RST), and a request sent on it would wait for the whole read timeout.
KEEPALIVE_S = 5.0


@dataclass
class _LoopState:
    client: openai.AsyncOpenAI
    semaphore: asyncio.Semaphore
    rpm: RateLimiter | None
    tpm: RateLimiter | None
    closer: AsyncGenerator[None, None] | None = None

    async def close(self) -> None:
        """Close the SDK client and its connections (the aiohttp session).

        aiohttp closes a connection's socket in a callback of the loop's next iteration: without that iteration
        (a loop stopped right after this) the socket stays open until garbage collection (a ResourceWarning).
        """
        await self.client.close()
        await asyncio.sleep(0)


def _close_states(states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState]) -> None:
    """A judge was garbage-collected: close its clients on the loops still running (the shared background loop of
    the sync API). A loop shutting down (``asyncio.run``) closes them through :func:`_close_with_loop`."""
    for loop in list(states):
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                loop.call_soon_threadsafe(_schedule_close, states, loop)


_closing: set[asyncio.Task[None]] = set()  # close tasks of dropped judges, held until done


def _schedule_close(states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState], loop: Any) -> None:
    state = states.get(loop)
    if state is not None:
        task = loop.create_task(state.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)


async def _close_with_loop(
    states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState], loop: asyncio.AbstractEventLoop
) -> AsyncGenerator[None]:
    """Closes the loop's client when the loop shuts down, for callers that never ``aclose()``.

    ``asyncio.run`` (and any loop closed with ``shutdown_asyncgens``) closes the async generators still
    suspended on it: this one's ``finally`` then closes the HTTP sessions (again, harmlessly, if a dropped
    judge's close already ran), so a plain ``asyncio.run`` script leaves nothing unclosed. The state holds
    the generator (the loop only holds it weakly).
    """
    try:
        yield
    finally:
        state = states.pop(loop, None)
        if state is not None:
            await state.close()


async def _count_attempt(request: httpx2.Request) -> None:
    await begin_attempt(is_chat(request.url))


async def _quota_is_final(response: httpx2.Response) -> None:
    if response.status_code == 429:
        await response.aread()
        mark_final_quota(response)


def endpoint_host(url: str | None, default: str = "api.openai.com") -> str:
    """``host[:port]`` of an endpoint URL: never its user, password, path or query."""
    if not url:
        return default
    parts = urlsplit(url if "://" in url else f"//{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or default
    return f"{host}:{port}" if port else host


class ObservedTransport(httpx2.AsyncBaseTransport):
    """Every HTTP attempt reported to the run's attempt observer (the circuit breaker), a chat completion's within
    its deadline and its reply read whole and bounded (:func:`~recall_tasks.judges._openai_reply.read_reply`)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, endpoint: str, timeout_s: float) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        with reported_attempt(self.endpoint, self.timeout_s) as report:
            if is_chat(request.url):
                response = await self._chat(request)
            else:
                response = await self.inner.handle_async_request(request)
        report.answered(response.status_code)
        return response

    async def _chat(self, request: httpx2.Request) -> httpx2.Response:
        """A chat-completion attempt within its deadline, its reply read whole and bounded (:func:`read_reply`)."""
        async with attempt_deadline(self.timeout_s):
            response = await self.inner.handle_async_request(request)
            try:
                headers = response.headers
                stream = response.stream
                assert isinstance(stream, AsyncIterable)
                read_all = stream.read_all if isinstance(stream, ReplyStream) else None
                content = await read_reply(
                    headers.get("content-encoding"), headers.get("content-length"), stream, read_all
                )
            finally:
                await response.aclose()
        return httpx2.Response(
            response.status_code, headers=decoded_headers(headers.multi_items()), content=content,
            request=request, extensions=response.extensions,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self.inner.aclose()


def endpoint_url(base_url: str | None, azure: dict[str, str]) -> str:
    """The URL the judge's requests go to (its proxy is chosen for it)."""
    return azure["azure_endpoint"] if azure else (base_url or "https://api.openai.com/v1")


def build_client(
    base_url: str | None,
    api_key: str,
    azure: dict[str, str],
    endpoint: str,
    timeout_s: float,
    max_retries: int,
    max_concurrency: int,
) -> openai.AsyncOpenAI:
    """One ``AsyncOpenAI`` (``AsyncAzureOpenAI`` with ``azure``) for the running loop, on the judge's aiohttp
    transport, every attempt observed (:class:`ObservedTransport`) and counted (``_openai_attempts.begin_attempt``)."""
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [_count_attempt], "response": [_quota_is_final]}
    connections = max(max_concurrency, 10)  # the default pool stops at 100 connections
    limits = httpx2.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=KEEPALIVE_S
    )
    transport = AiohttpTransport(limits, env_proxy(endpoint_url(base_url, azure)))
    http = openai.DefaultAsyncHttpxClient(
        transport=ObservedTransport(transport, endpoint, timeout_s), timeout=timeout_s, event_hooks=hooks
    )
    common: dict[str, Any] = {
        "api_key": api_key or "no-key",  # a self-hosted endpoint without auth
        "timeout": timeout_s,
        "max_retries": max_retries,
        "http_client": http,
    }
    client: openai.AsyncOpenAI
    if azure:
        client = openai.AsyncAzureOpenAI(
            azure_endpoint=azure["azure_endpoint"],
            api_version=azure["api_version"],
            **common,
        )
    else:
        client = openai.AsyncOpenAI(base_url=base_url, **common)
    return client


#: ``openai.omit``, the SDK's documented way to leave a keyword out of a request, typed ``Any``: ``create`` types
#: ``messages`` as required (and checks that it is passed, not what it holds)
_OMITTED: Any = openai.omit


async def post_chat(client: openai.AsyncOpenAI, body: dict[str, Any]) -> bytes:
    """POST ``body`` to ``/chat/completions`` (``chat.completions.create``, with the SDK's retries and errors) and
    return the 2xx reply's bytes, unparsed (the judge reads them: ``_openai_wire.read_completion``).

    ``body`` (:func:`~recall_tasks.judges._openai_wire.request_body`'s, ``model`` first) goes whole as
    ``extra_body``, whose values the SDK documents as taking precedence; of ``create``'s keywords only ``model`` is
    given (Azure's client routes to the deployment by it), ``messages`` is ``openai.omit``. The SDK then sends
    ``model`` and after it the rest of ``body`` in its own order: what the judge always sent and what a Batch API
    line holds, byte for byte (``tests/test_wire_golden.py``), on every SDK version. Typed keywords would take the
    places the SDK's version gives them (3.0 puts ``messages`` before ``model``, 3.57 after it; both put
    ``temperature`` after ``response_format``), and the SDK's params transform would walk every message as a union
    of TypedDicts (a quarter of ``create``'s CPU in a ``benchmarks/_cpu_child.py --profile`` at ``428cbfe``)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=body["model"], messages=_OMITTED, extra_body=body
    )
    return raw.content
