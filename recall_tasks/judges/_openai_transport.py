"""The judge's HTTP transport: httpx2 requests (what the openai SDK sends) on an aiohttp session of its own.

Why aiohttp and why a transport of our own: the SDK's ``openai[aiohttp]`` client costs a third of the client CPU
of httpx2's default pool at 100+ requests in flight, but its transport class lives in a private module of the SDK
(its ``_vendor`` package), and reaching into a client for it is what issue 57 took out. This one is built on
aiohttp's public API only (a ``ClientSession`` on a ``TCPConnector`` made here) and does what the SDK's did, plus:

- **The wire is aiohttp's**: framing, 1xx replies, header limits (a reply past them is httpx2's
  ``RemoteProtocolError``, which the SDK retries and reports, not a bare aiohttp error), keep-alive expiry
  (``Limits.keepalive_expiry``); redirects are httpx2's to follow (each hop an attempt of its own, as the SDK
  counts it). Bodies go out as sent and come back as sent: the caller decodes (httpx2's decoders).
- **aiohttp's errors as httpx2's** (:class:`_MappedErrors`), by the mapping the SDK's aiohttp transport uses, so
  the SDK retries and raises as it always did: a read timeout is ``ReadTimeout``, and any other connection error
  ``ConnectTimeout`` (refused, reset, DNS: the cause stays in the chain, which
  :func:`~recall_tasks.judges._openai_reply.describe_failure` reads).
- **No stray bytes**: a pooled connection on which bytes arrived while it sat idle is closed, not reused
  (:class:`_NoStrayBytesConnector`).
- **Proxies**: ``HTTP(S)_PROXY``/``ALL_PROXY`` and ``NO_PROXY``, read once for the judge's endpoint
  (:func:`env_proxy`): a client passed a transport gets no proxies from httpx2.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx2

#: aiohttp's exceptions and the httpx2 exception each becomes; of several that match, the most derived (the SDK's
#: aiohttp transport's table, in its order: a generic connection error is a ``ConnectTimeout`` there too).
_ERRORS: list[tuple[type[BaseException], type[httpx2.HTTPError]]] = [
    (aiohttp.ServerTimeoutError, httpx2.TimeoutException),
    (aiohttp.SocketTimeoutError, httpx2.ReadTimeout),
    (aiohttp.ClientConnectionError, httpx2.ConnectTimeout),
    (aiohttp.ClientConnectorError, httpx2.ConnectError),
    (aiohttp.ClientPayloadError, httpx2.ReadError),
    (aiohttp.ClientProxyConnectionError, httpx2.ProxyError),
    (aiohttp.ClientHttpProxyError, httpx2.ProxyError),
    (aiohttp.NonHttpUrlClientError, httpx2.UnsupportedProtocol),
    (aiohttp.InvalidUrlClientError, httpx2.UnsupportedProtocol),
]


def _mapped(exc: BaseException) -> type[httpx2.HTTPError] | None:
    found: type[httpx2.HTTPError] | None = None
    for source, target in _ERRORS:
        if isinstance(exc, source) and (found is None or issubclass(target, found)):
            found = target
    return found


class _MappedErrors:
    """aiohttp's exceptions raised as httpx2's (the cause chained). Its refusals of a reply it will not parse (a
    header past its limits, too many headers, a malformed status line), which the SDK's aiohttp transport let
    through, become ``RemoteProtocolError``: the SDK retries them and raises its ``APIConnectionError``, as for any
    broken reply. A class, not a generator: it is entered twice an attempt."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, Exception):
            return
        target = _mapped(exc)
        if target is not None:
            raise target(str(exc)) from exc
        if isinstance(exc, aiohttp.ClientResponseError):
            what = " ".join(str(exc.message).split(": b'")[0].split())[:120]  # not the reply's bytes aiohttp quotes
            raise httpx2.RemoteProtocolError(f"invalid reply: {what}") from exc


mapped_errors = _MappedErrors()


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


class ReplyStream(httpx2.AsyncByteStream):
    """A reply's body as sent, read from aiohttp (its errors as httpx2's)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with mapped_errors:
            async for chunk in self.response.content.iter_any():
                yield chunk

    async def read_all(self) -> bytes:
        """The whole body in one call (a body whose length is known)."""
        with mapped_errors:
            return await self.response.read()

    async def aclose(self) -> None:
        self.response.release()


def env_proxy(url: str) -> httpx2.Proxy | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY``/``HTTPS_PROXY`` by its scheme, else
    ``ALL_PROXY``), unless ``NO_PROXY`` exempts its host (the standard library's reading of both)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.netloc.rsplit("@", 1)[-1]):
        return None
    return httpx2.Proxy(proxy if "://" in proxy else f"http://{proxy}")


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """httpx2 requests on one aiohttp session, made on the first request (it belongs to the running loop)."""

    def __init__(self, limits: httpx2.Limits, proxy: httpx2.Proxy | None = None) -> None:
        self._limits = limits
        self._ssl = httpx2.create_ssl_context(trust_env=True)  # the SDK's: certifi, or SSL_CERT_FILE / SSL_CERT_DIR
        self._session: aiohttp.ClientSession | None = None
        self._proxy: dict[str, Any] = {}
        if proxy is not None:
            auth = aiohttp.BasicAuth(*proxy.auth) if proxy.auth else None
            self._proxy = {"proxy": str(proxy.url), "proxy_auth": auth, "proxy_headers": dict(proxy.headers)}
        self._timeouts: dict[tuple[Any, Any, Any], aiohttp.ClientTimeout] = {}

    def session(self) -> aiohttp.ClientSession:
        """The session (made now if not yet): the connection pool, its limit and keep-alive expiry."""
        if self._session is None:
            limits = self._limits  # no max_connections: no limit (aiohttp's 0)
            connector = _NoStrayBytesConnector(
                limit=limits.max_connections or 0, keepalive_timeout=limits.keepalive_expiry, ssl=self._ssl
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _timeout(self, request: httpx2.Request) -> aiohttp.ClientTimeout:
        """The request's httpx2 timeouts as aiohttp's (per connect, per read, the pool's wait)."""
        timeout = request.extensions.get("timeout", {})
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            found = self._timeouts[key] = aiohttp.ClientTimeout(sock_connect=key[0], sock_read=key[1], connect=key[2])
        return found

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = self.session()
        data: Any
        try:
            data = request.content or None
        except httpx2.RequestNotRead:  # a streamed body (a file upload): aiohttp frames it
            data = request.stream
            request.headers.pop("transfer-encoding", None)
        with mapped_errors:
            response = await session.request(
                request.method, str(request.url), headers=request.headers, data=data, allow_redirects=False,
                auto_decompress=False, compress=False, timeout=self._timeout(request),
                server_hostname=request.extensions.get("sni_hostname"), **self._proxy,
            )  # fmt: skip
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx2.Response(
            response.status, headers=response.raw_headers, stream=ReplyStream(response), request=request,
            extensions=extensions,
        )  # fmt: skip

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
