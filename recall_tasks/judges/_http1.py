"""The judge's HTTP/1.1 connections for chat requests: keep-alive sockets, httptools' parser, nothing else.

Why: with the lean chat path (``_openai_lean.py``) aiohttp's own request machinery was ~45 % of a judged row's
client CPU (``ClientSession._request``: the request and response objects, tracing, cookies, timers, the
connector's bookkeeping). A chat request here is one ``transport.write`` of bytes built once per client (request
line and headers) plus the body, and the reply is parsed by httptools (llhttp, the parser of uvicorn) as it
arrives: ~0.14 ms of CPU a request against ~0.4 ms (``benchmarks/cpu_per_row.py``).

What it keeps from aiohttp, so that callers, the SDK's retries and the circuit breaker see the same things:

- the exceptions aiohttp raises for the same events, with the same arguments (``ClientConnectorError`` and its
  DNS/SSL subclasses on connect, ``ConnectionTimeoutError``, ``SocketTimeoutError`` when no byte arrives for the
  read timeout, ``ClientOSError`` from a reset, ``ServerDisconnectedError`` on a close before the reply,
  ``ClientPayloadError`` for a body it cannot decode), so ``map_aiohttp_exceptions`` maps them as before;
- connections raced over IPv6 and IPv4 with aiohappyeyeballs (aiohttp's library for it);
- the pool's limit (connections per client), keep-alive reuse (most recently used first), ``Connection: close``
  and HTTP/1.0 replies closing their socket, and gzip/deflate bodies decoded (the SDK sends
  ``accept-encoding: gzip, deflate``).

What it does not do: redirects, proxies, 1xx replies and other content encodings. A 3xx reply is returned to
the caller, which sends the request again on aiohttp (``LeanChat``), the path that follows redirects.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import zlib
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import aiohappyeyeballs
import aiohttp
import httptools
from aiohttp.client_reqrep import ConnectionKey

Headers = list[tuple[bytes, bytes]]


class _Reply:
    __slots__ = ("body", "headers", "status", "keep_alive", "headers_done")

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.headers: Headers = []
        self.status = 0
        self.keep_alive = True
        self.headers_done = False

    def ends_at_close(self, status: int) -> bool:
        """No length and not chunked: the body ends when the server closes (read only when it closes)."""
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names and status not in (204, 304)


class _Connection(asyncio.Protocol):
    """One keep-alive socket: at most one request in flight; the reply completes ``waiter``."""

    def __init__(self, read_timeout: float) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.read_timeout = read_timeout
        self.reply: _Reply | None = None
        self.waiter: asyncio.Future[_Reply] | None = None
        # the read timeout: one timer per connection, re-armed when it fires early (never cancelled per request)
        self.timer: asyncio.TimerHandle | None = None
        self.last_io = 0.0  # loop time of the request's write or of its reply's latest bytes
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        assert self.loop is not None
        self.last_io = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(aiohttp.ClientPayloadError(f"invalid HTTP reply: {exc}"), exc)
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()
        if self.waiter is None or self.waiter.done():
            return
        reply = self.reply
        ended = reply is not None and reply.headers_done and reply.ends_at_close(self.parser.get_status_code())
        if exc is None and ended:  # the close ends the body
            assert reply is not None
            reply.keep_alive = False
            self.on_message_complete()
        elif exc is None:
            self._fail(aiohttp.ServerDisconnectedError(None))
        elif isinstance(exc, OSError):
            self._fail(aiohttp.ClientOSError(*exc.args), exc)
        else:
            self._fail(aiohttp.ClientConnectionError(f"Connection lost: {exc}"), exc)

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self.reply = _Reply()

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.reply is not None
        self.reply.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.reply is not None
        self.reply.headers_done = True

    def on_body(self, body: bytes) -> None:
        assert self.reply is not None
        self.reply.body.append(body)

    def on_message_complete(self) -> None:
        reply, self.reply = self.reply, None
        waiter, self.waiter = self.waiter, None
        if reply is None or waiter is None or waiter.done():
            self.close()  # an answer nobody asked for: the socket cannot be trusted
            return
        reply.status = self.parser.get_status_code()
        reply.keep_alive = reply.keep_alive and self.parser.should_keep_alive()
        waiter.set_result(reply)

    # -- ours
    def send(self, data: bytes, waiter: asyncio.Future[_Reply]) -> None:
        assert self.transport is not None and self.loop is not None
        self.waiter = waiter
        self.last_io = self.loop.time()
        self.transport.write(data)
        if self.timer is None:
            self.timer = self.loop.call_at(self.last_io + self.read_timeout, self._timed_out)

    def _timed_out(self) -> None:
        """No byte for ``read_timeout`` s while a request waits: fail it (aiohttp's ``sock_read``); else re-arm."""
        assert self.loop is not None
        self.timer = None
        if self.waiter is None or self.closed:
            return  # idle: the next request arms it again
        due = self.last_io + self.read_timeout
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._timed_out)
            return
        self._fail(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
        self.close()

    def _fail(self, exc: BaseException, cause: BaseException | None = None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            exc.__cause__ = cause
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Keep-alive HTTP/1.1 connections to one origin, for POSTs of one path with fixed headers, on one loop."""

    def __init__(self, url: str, limit: int, timeout_s: float, ssl_context: Any) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or ""
        self.is_ssl = parts.scheme == "https"
        self.port = parts.port or (443 if self.is_ssl else 80)
        self.ssl: ssl.SSLContext | None = ssl_context if self.is_ssl else None
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(limit)
        self._busy: set[_Connection] = set()
        self._closed = False

    @staticmethod
    def accepts(url: str) -> bool:
        """Whether a URL is one this pool can talk to (plain http or https, a host, no credentials)."""
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.username is None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        key = ConnectionKey(self.host, self.port, self.is_ssl, True, None, None, None)
        try:
            async with asyncio.timeout(self.timeout_s):
                infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
                # IPv6 and IPv4 raced as aiohttp does, with its library: asyncio's own race (happy_eyeballs_delay)
                # leaves a connected socket unclosed when the task is cancelled mid-race (Python 3.11)
                sock = await aiohappyeyeballs.start_connection(infos, happy_eyeballs_delay=0.25, interleave=1)
                try:
                    _, conn = await loop.create_connection(
                        lambda: _Connection(self.timeout_s),
                        sock=sock,
                        ssl=self.ssl,
                        server_hostname=self.host if self.ssl is not None else None,
                    )
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to host {'https' if self.is_ssl else 'http'}://{self.host}:{self.port}"
            ) from exc
        except ssl.CertificateError as exc:
            raise aiohttp.ClientConnectorCertificateError(key, exc) from exc
        except ssl.SSLError as exc:
            raise aiohttp.ClientConnectorSSLError(key, exc) from exc
        except socket.gaierror as exc:
            raise aiohttp.ClientConnectorDNSError(key, exc) from exc
        except OSError as exc:
            raise aiohttp.ClientConnectorError(key, exc) from exc
        return conn  # asyncio sets TCP_NODELAY on TCP sockets

    def head(self, headers: dict[str, str]) -> bytes:
        """The request line and ``headers`` of a POST, up to the body's length (what :meth:`post` takes)."""
        lines = [f"POST {self.target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")

    async def post(self, head: bytes, body: bytes) -> tuple[int, Headers, bytes]:
        """POST ``body`` after ``head`` (:meth:`head`): the status, raw headers and decoded body of the reply."""
        if self._closed:
            raise aiohttp.ClientConnectionError("the judge's connections are closed")
        await self._slots.acquire()
        conn: _Connection | None = None
        try:
            while self._idle:
                candidate = self._idle.pop()
                if not candidate.closed and candidate.transport is not None and not candidate.transport.is_closing():
                    conn = candidate
                    break
            if conn is None:
                conn = await self._connect()
            self._busy.add(conn)
            waiter: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
            conn.send(b"%s%d\r\n\r\n%s" % (head, len(body), body), waiter)
            try:
                reply = await waiter
            except BaseException:
                conn.close()  # a cancelled or failed exchange leaves the socket mid-reply
                raise
            content = b"".join(reply.body) if len(reply.body) != 1 else reply.body[0]
            if reply.keep_alive and not self._closed and not conn.closed:
                self._busy.discard(conn)
                self._idle.append(conn)
                conn = None
            return reply.status, reply.headers, _decode(reply.headers, content)
        finally:
            if conn is not None:
                self._busy.discard(conn)
                conn.close()
            self._slots.release()

    async def aclose(self) -> None:
        """Close every socket (those in flight fail their request)."""
        self._closed = True
        for conn in list(self._idle) + list(self._busy):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost


def _decode(headers: Headers, content: bytes) -> bytes:
    """The body as the SDK's client would read it: gzip and deflate decoded (what it asks for), else as is."""
    for name, value in headers:
        if name.lower() != b"content-encoding":
            continue
        coding = value.strip().lower()
        if coding in (b"", b"identity"):
            return content
        try:
            if coding in (b"gzip", b"x-gzip"):
                return zlib.decompress(content, 16 + zlib.MAX_WBITS)
            if coding == b"deflate":
                try:
                    return zlib.decompress(content)
                except zlib.error:
                    return zlib.decompress(content, -zlib.MAX_WBITS)  # raw deflate, as some servers send it
        except zlib.error as exc:
            raise aiohttp.ClientPayloadError(f"Can not decode content-encoding: {coding.decode()}") from exc
        raise aiohttp.ClientPayloadError(f"unsupported content-encoding: {value.decode('latin-1')}")
    return content
