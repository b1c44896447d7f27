"""The judge's lean chat-completions path: one POST on the SDK client's own aiohttp session, nothing around it.

Why: most of a judged row's client CPU on the SDK path goes to the layers between the judge and aiohttp (the
SDK's request options, URL and header objects, httpx2's client, the httpx2-over-aiohttp bridge), not to the
request: this path costs less than half as much (``benchmarks/cpu_per_row.py``; the figures are in
docs/design.md, "The judge"). It sends the same bytes on the same session, so every byte on the wire is
aiohttp's (framing, 1xx replies, header limits, keep-alive expiry, redirects) and every decoded byte httpx2's:

- **What it sends**: the URL and headers the SDK builds for a chat request on this client (its own
  request building, once, on the first call; only ``x-stainless-retry-count`` changes per attempt), and the body
  serialised as the SDK does (:func:`dumps`).
- **What it keeps from the SDK**: its retry decision and delay (Retry-After, ``x-should-retry``, jittered
  backoff), its typed errors (``APITimeoutError``/``APIConnectionError`` over the same aiohttp-to-httpx2 exception
  mapping), the reply's decoding and bounds and the attempt's deadline (``_openai_reply.read_reply``,
  ``attempt_deadline``), and what an attempt does (``_openai_attempts``: reserved, counted, reported to the
  breaker, the quota rule): the same functions as the SDK path's, so :func:`~recall_tasks.judges._openai_errors.
  translate_error`, the breaker and the tests see what they saw. The SDK's functions are private: every access
  is in :mod:`~recall_tasks.judges._openai_compat` (CI runs the judge's tests on the oldest ``openai`` that
  pyproject.toml allows too: ``make test-oldest-openai``).
- **When it applies** (:func:`lean_chat`): a plain ``AsyncOpenAI`` on the aiohttp transport, without proxies
  (``HTTP(S)_PROXY`` mounts), custom auth, workload identity or a provider runtime. Azure, files and batches,
  the pre-flight probe and everything else use the SDK as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import httpx2
import openai

from recall_tasks.judges import _openai_compat as compat
from recall_tasks.judges._json import dumps_compact
from recall_tasks.judges._openai_attempts import begin_attempt, mark_final_quota, reported_attempt
from recall_tasks.judges._openai_http import ObservedTransport
from recall_tasks.judges._openai_reply import attempt_deadline, decoded_headers, map_reply_errors, read_reply

log = logging.getLogger("openai._base_client")  # the SDK's retry messages, under the SDK's logger as before


def dumps(body: dict[str, Any]) -> bytes:
    """A request body as the SDK serialises it (``openapi_dumps``: httpx's JSON settings), byte for byte."""
    return dumps_compact(body)


class LeanChat:
    """POST ``/chat/completions`` bodies on ``client``'s aiohttp session, with the SDK's retries and errors."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        transport: compat.AiohttpTransport,
        observed: ObservedTransport,
        timeout_s: float,
    ) -> None:
        self._client = client
        self._transport = transport  # the AiohttpTransport: its ``client`` is the session, made on first use
        self._observed = observed  # the ObservedTransport around it (endpoint and timeout for the breaker)
        self._map = compat.aiohttp_error_mapping()
        self._options = compat.chat_options()
        self._timeout = aiohttp.ClientTimeout(sock_connect=timeout_s, sock_read=timeout_s, connect=timeout_s)
        self._timeout_s = timeout_s
        self._session_type = aiohttp.ClientSession
        self._url: str | None = None
        self._request: httpx2.Request | None = None  # what the SDK's errors carry
        self._headers: list[dict[str, str]] = []  # per retry count
        self._building: asyncio.Lock | None = None

    async def _template(self) -> None:
        """The URL and headers of a chat request, built by the SDK as its ``request`` does before sending."""
        request = await compat.chat_request(self._client, self._options)
        self._request = httpx2.Request("POST", request.url, headers=request.headers)
        self._url = str(request.url)

    async def _ready(self) -> bool:
        """The template is built; False when the client is closed (the caller then uses the SDK, which raises)."""
        if self._url is None:
            self._building = self._building or asyncio.Lock()
            async with self._building:
                if self._url is None:
                    await self._template()
        return self._aiohttp() is not None

    def _aiohttp(self) -> Any:
        """The SDK client's aiohttp session, made as its transport would; None once closed."""
        session = self._transport.client
        if not isinstance(session, self._session_type):  # made on the transport's first request: here, the same
            session = self._transport.client = self._transport.get_client()
        if session.closed:
            return None  # a closed client: the SDK path raises what it always raised
        return session

    def _headers_for(self, retries: int) -> dict[str, str]:
        while len(self._headers) <= retries:
            assert self._request is not None
            items = {k: v for k, v in self._request.headers.items() if k != "content-length"}
            items["x-stainless-retry-count"] = str(len(self._headers))
            self._headers.append(items)
        return self._headers[retries]

    async def _exchange(self, body: bytes, retries: int) -> tuple[int, Any, bytes]:
        """One attempt within its deadline: status, raw headers and the decoded, bounded body (redirects followed)."""
        session = self._aiohttp()
        if session is None:
            raise aiohttp.ClientConnectionError("the judge's client is closed")
        async with attempt_deadline(self._timeout_s):
            response = await session.post(
                self._url, data=body, headers=self._headers_for(retries), timeout=self._timeout,
                allow_redirects=True, compress=False, auto_decompress=False,
            ).__aenter__()  # fmt: skip
            try:
                headers = response.headers
                content = await read_reply(
                    headers.get("content-encoding"), headers.get("content-length"), response.content.iter_any(),
                    response.read,
                )  # fmt: skip
            finally:
                response.release()
        return response.status, response.raw_headers, content

    async def post(self, body: bytes) -> bytes | None:
        """The 2xx reply body of ``body`` after the SDK's retries, or None when the client is closed (the caller
        then uses the SDK, which raises as it did). Raises the SDK's errors."""
        if not await self._ready():
            return None
        max_retries = self._client.max_retries
        for retries in range(max_retries + 1):
            remaining = max_retries - retries
            await begin_attempt(chat=True)
            try:
                observed = self._observed
                with reported_attempt(observed.endpoint, observed.timeout_s) as report, map_reply_errors(), self._map():
                    status, raw_headers, content = await self._exchange(body, retries)
                report.answered(status)
            except httpx2.TimeoutException as err:
                if remaining > 0:
                    await self._sleep(remaining, retries, max_retries, None)
                    continue
                raise openai.APITimeoutError(request=self._request) from err  # type: ignore[arg-type]
            except httpx2.RequestError as err:
                if remaining > 0:
                    await self._sleep(remaining, retries, max_retries, None)
                    continue
                raise openai.APIConnectionError(request=self._request) from err  # type: ignore[arg-type]
            if 200 <= status < 300:
                return content
            reply = httpx2.Response(
                status, headers=decoded_headers(raw_headers), content=content, request=self._request
            )
            mark_final_quota(reply)  # the SDK path's rule, in its response hook
            if remaining > 0 and compat.should_retry(self._client, reply):
                await self._sleep(remaining, retries, max_retries, reply.headers)
                continue
            raise compat.status_error(self._client, reply) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _sleep(self, remaining: int, retries: int, max_retries: int, headers: httpx2.Headers | None) -> None:
        delay = compat.retry_delay(self._client, remaining, self._options, headers)
        log.info("Retrying request in %f seconds (retry %i of %s)", delay, retries + 1, max_retries)
        await asyncio.sleep(delay)


def lean_chat(client: openai.AsyncOpenAI, timeout_s: float) -> LeanChat | None:
    """The lean path for ``client`` when it applies (see the module's docstring), else None."""
    http = compat.http_client(client)
    observed = compat.base_transport(http)
    if not compat.plain_client(client) or compat.has_mounts(http) or not isinstance(observed, ObservedTransport):
        return None
    inner = compat.aiohttp_transport(observed.inner)
    if inner is None or inner.proxy is not None:
        return None
    return LeanChat(client, inner, observed, timeout_s)
