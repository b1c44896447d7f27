"""The OpenAI judge's HTTP side: its clients on the SDK's aiohttp transport, one per event loop, and their life cycle.

Split from :mod:`recall_tasks.judges.openai_judge` (the judge: prompts, budgets, costs; its wire format in
:mod:`~recall_tasks.judges._openai_wire`), which builds one client per event loop with :func:`build_client`.
Beside it: what one attempt does and means (:mod:`~recall_tasks.judges._openai_attempts`: reserved, counted,
reported to the circuit breaker, the quota rule), a reply read whole and bounded within its deadline
(:mod:`~recall_tasks.judges._openai_reply`), SDK errors (:mod:`~recall_tasks.judges._openai_errors`), and every
private member of the SDK used (:mod:`~recall_tasks.judges._openai_compat`).

- Every HTTP attempt (retries included) goes through :class:`ObservedTransport`, which reports it to the run's
  circuit breaker (:func:`~recall_tasks.judges._openai_attempts.reported_attempt`), and every chat-completion
  attempt has a deadline and a bounded reply, on either chat path (the SDK's, or the lean one over the same
  aiohttp session). The wire itself (framing, 1xx replies, header limits, keep-alive expiry, redirects) is
  aiohttp's on both paths. The endpoint is named by host and port only.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import httpx2
import openai

from recall_tasks.judges import _openai_compat as compat
from recall_tasks.judges._openai_attempts import begin_attempt, mark_final_quota, reported_attempt
from recall_tasks.judges._openai_reply import attempt_deadline, decoded_headers, is_chat, map_reply_errors, read_reply
from recall_tasks.judges.ratelimit import RateLimiter

#: Seconds a keep-alive connection may stay idle before it is closed rather than reused (httpx2's default): a load
#: balancer or NAT that forgets an idle connection (many do after a minute or a few) drops it silently (no FIN, no
#: RST), and a request sent on it would wait for the whole read timeout.
KEEPALIVE_S = 5.0


class ChatPoster(Protocol):
    """A chat-completions path beside the SDK's (:class:`~recall_tasks.judges._openai_lean.LeanChat`)."""

    async def post(self, body: bytes) -> bytes | None: ...


@dataclass
class _LoopState:
    client: openai.AsyncOpenAI
    semaphore: asyncio.Semaphore
    rpm: RateLimiter | None
    tpm: RateLimiter | None
    closer: AsyncGenerator[None, None] | None = None
    lean: ChatPoster | None = None  # the chat requests' path when it applies (judges/_openai_lean.py)

    async def close(self) -> None:
        """Close the SDK client's connections (the lean chat path sends on them too).

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
    """Every HTTP attempt of the SDK path reported to the run's attempt observer (the circuit breaker), a chat
    completion's within its deadline and its reply bounded; the lean path reports its own the same way."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, endpoint: str, timeout_s: float) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        with reported_attempt(self.endpoint, self.timeout_s) as report, map_reply_errors():
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
                content = await read_reply(headers.get("content-encoding"), headers.get("content-length"), stream)
            finally:
                await response.aclose()
        return httpx2.Response(
            response.status_code, headers=decoded_headers(headers.multi_items()), content=content,
            request=request, extensions=response.extensions,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self.inner.aclose()


class _NoStrayBytesConnector(aiohttp.TCPConnector):
    """aiohttp's connector, except that a pooled connection on which bytes arrived while it sat idle (a server
    that wrote more than its reply: a miscounted body, a second reply) is closed, not reused. aiohttp closes such
    a connection when the bytes come before it is released, not after: its pool hands it out again (aiohttp
    3.14: the reuse check looks at the idle time only), and the next request takes those bytes for its reply."""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        while True:
            conn = await super().connect(req, traces, timeout)
            protocol = conn.protocol
            if protocol is None or not protocol.should_close:
                return conn
            conn.close()


def _session_of(transport: compat.AiohttpTransport) -> Callable[[], aiohttp.ClientSession]:
    """The session the SDK's aiohttp transport would make (its ``get_client``), on :class:`_NoStrayBytesConnector`."""

    def make() -> aiohttp.ClientSession:
        limits = transport.limits
        limit: dict[str, Any] = {"limit": limits.max_connections} if limits.max_connections is not None else {}
        connector = _NoStrayBytesConnector(
            keepalive_timeout=limits.keepalive_expiry, ssl=transport.ssl_context,
            local_addr=(transport.local_address, 0) if transport.local_address else None, **limit,
        )  # fmt: skip
        return aiohttp.ClientSession(connector=connector)

    return make


def build_client(
    base_url: str | None,
    api_key: str,
    azure: dict[str, str],
    endpoint: str,
    timeout_s: float,
    max_retries: int,
    max_concurrency: int,
) -> openai.AsyncOpenAI:
    """One ``AsyncOpenAI`` (``AsyncAzureOpenAI`` with ``azure``) for the running loop, on the aiohttp transport,
    every attempt observed (:class:`ObservedTransport`) and counted (``_openai_attempts.begin_attempt``)."""
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [_count_attempt], "response": [_quota_is_final]}
    http: httpx2.AsyncClient
    connections = max(max_concurrency, 10)  # the default pool stops at 100 connections
    limits = httpx2.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=KEEPALIVE_S
    )
    try:  # aiohttp transport: a third of the client CPU of the default httpx pool at 100+ in flight
        http = openai.DefaultAioHttpClient(timeout=timeout_s, event_hooks=hooks, limits=limits)
    except (RuntimeError, ImportError):
        http = httpx2.AsyncClient(timeout=timeout_s, limits=limits, event_hooks=hooks)
    for transport in compat.transports(http):
        aio = compat.aiohttp_transport(transport)
        if aio is not None and aio.uds is None:
            aio.client = _session_of(aio)  # made on first use, as the transport's own
    # every attempt goes through one of these transports (the mounts: proxies from HTTP(S)_PROXY)
    compat.wrap_transports(http, lambda t: ObservedTransport(t, endpoint, timeout_s))
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
