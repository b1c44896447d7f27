"""The OpenAI judge's HTTP side: its clients and their life cycle, what a failed attempt means, SDK errors.

Split from :mod:`recall_tasks.judges.openai_judge` (the judge: prompts, budgets, costs; its wire format in
:mod:`~recall_tasks.judges._openai_wire`), which builds one client per event loop with :func:`build_client` and
maps SDK errors with :func:`translate_error`.

- Every HTTP attempt (retries included) is reported to the run's circuit breaker through
  :data:`~recall_tasks.judges.base.attempt_observer` (a wrapper around the HTTP transport): refused, reset,
  DNS and TLS failures, timeouts and 5xx count as failures.
- Error texts say what happened, read from the exception chain under the SDK's error (the aiohttp transport
  maps a refused connection to a *timeout*): "connection refused", "DNS lookup failed", "TLS error", "no answer
  within N s" only for real timeouts, the HTTP status otherwise. The endpoint is named by host and port only.
- Every chat-completion attempt, on either chat path (the SDK's, or :mod:`~recall_tasks.judges._openai_lean`'s
  over the same aiohttp session), has a deadline for the whole exchange (:func:`attempt_deadline`: connect,
  send, the reply's head and every byte of its body within ``timeout_s``; aiohttp's own timeouts are per read,
  so a reply trickled a byte at a time would hold the row without end) and a bounded reply
  (:func:`read_reply`: :data:`MAX_REPLY_BYTES` as sent and once decoded, decoded by httpx2's decoders, which
  is what the SDK's ``accept-encoding`` offers). Both fail the attempt, which the SDK's retry policy then retries
  (a timeout as a timeout). The wire itself (framing, 1xx replies, header limits, keep-alive expiry, redirects)
  is aiohttp's on both paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import re
import socket
import ssl
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import httpx2
import openai

from recall_tasks.errors import JudgeConfigError, JudgeRejectedError, JudgeTransientError
from recall_tasks.judges.base import attempt_gate, attempt_observer
from recall_tasks.judges.ratelimit import RateLimiter
from recall_tasks.secrets import redact

#: HTTP attempts of the judge call running in this context (retries included): the request hook counts them.
_attempts: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("_attempts", default=None)


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


#: Seconds a keep-alive connection may stay idle before it is closed rather than reused (httpx2's default): a load
#: balancer or NAT that forgets an idle connection (many do after a minute or a few) drops it silently (no FIN, no
#: RST), and a request sent on it would wait for the whole read timeout.
KEEPALIVE_S = 5.0

#: The most a chat-completion reply may hold, as sent and once decoded. A verdict reply is a few KB: this only
#: stops a broken or hostile endpoint from holding the run's memory (a 65 KB gzip bomb decodes to 64 MiB).
MAX_REPLY_BYTES = 8 * 2**20


class ReplyTooLargeError(httpx2.ReadError):
    """A chat-completion reply over :data:`MAX_REPLY_BYTES` (as sent, or decoded): the attempt fails (an httpx2
    read error: the SDK retries it as it retries a reply cut short)."""


@contextlib.contextmanager
def map_reply_errors() -> Iterator[None]:
    """aiohttp's errors for a reply it refuses to parse (a header past its limits, too many headers, a malformed
    status line), which its httpx2 transport leaves unmapped, as httpx2's ``RemoteProtocolError``: the SDK
    retries them and raises its ``APIConnectionError``, as for any broken reply, instead of a bare aiohttp error."""
    try:
        yield
    except aiohttp.ClientResponseError as exc:
        what = " ".join(str(exc.message).split(": b'")[0].split())[:120]  # not the reply's bytes aiohttp quotes
        raise httpx2.RemoteProtocolError(f"invalid reply: {what}") from exc


@contextlib.asynccontextmanager
async def attempt_deadline(timeout_s: float) -> AsyncIterator[None]:
    """One attempt's whole exchange within ``timeout_s``; past it, ``httpx2.ReadTimeout`` (the SDK's timeout)."""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            yield
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise httpx2.ReadTimeout(f"no complete reply within {timeout_s:g} s") from exc


class _Counted(httpx2.AsyncByteStream):
    """Bytes as sent, refused past :data:`MAX_REPLY_BYTES`."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._chunks:
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise ReplyTooLargeError(f"reply larger than {MAX_REPLY_BYTES // 2**20} MiB as sent")
            yield chunk


async def read_reply(
    encoding: str | None,
    length: str | None,
    chunks: AsyncIterable[bytes],
    read_all: Callable[[], Awaitable[bytes]] | None = None,
) -> bytes:
    """A chat-completion reply's body from its bytes as sent, decoded by httpx2 as the SDK decodes it, refused
    (:class:`ReplyTooLargeError`) past :data:`MAX_REPLY_BYTES` as sent (its Content-Length, else its bytes as they
    come) or decoded (httpx2's decoders give at most 1 MiB at a time: a bomb stops at the bound, not its size).
    ``read_all`` (the lean path's) reads a plain body whose Content-Length is within the bound in one call."""
    limit = MAX_REPLY_BYTES
    declared = int(length) if length is not None and length.strip().isdigit() else None
    if declared is not None and declared > limit:
        raise ReplyTooLargeError(f"reply larger than {limit // 2**20} MiB as sent (Content-Length {declared})")
    parts: list[bytes] = []
    size = 0
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        if declared is not None and read_all is not None:  # the length is within the bound: nothing to count
            return await read_all()
        async for chunk in _Counted(chunks):
            parts.append(chunk)
        return b"".join(parts)
    decoding = httpx2.Response(200, headers={"content-encoding": encoding}, stream=_Counted(chunks))
    async for piece in decoding.aiter_bytes():
        size += len(piece)
        if size > limit:
            await decoding.aclose()
            raise ReplyTooLargeError(f"reply larger than {limit // 2**20} MiB once decoded ({encoding.strip()})")
        parts.append(piece)
    return b"".join(parts)


_FRAMING = frozenset(("content-encoding", "content-length", "transfer-encoding"))


def decoded_headers(headers: Any) -> list[tuple[Any, Any]]:
    """A reply's ``(name, value)`` headers without those of its framing: its body is decoded already."""
    return [(k, v) for k, v in headers if (k.decode("latin-1") if isinstance(k, bytes) else k).lower() not in _FRAMING]


def is_chat(url: httpx2.URL) -> bool:
    return url.path.rstrip("/").endswith("/chat/completions")


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
    if is_chat(request.url):
        await reserve_attempt()
    counter = _attempts.get()
    if counter is not None:
        counter[0] += 1


async def reserve_attempt() -> None:
    """Before a chat-completion attempt goes out (either path): the run's budget pays for its worst case first
    (:class:`~recall_tasks.judges.base.AttemptGate`; raises ``BudgetReached``, the attempt is not sent)."""
    gate = attempt_gate.get()
    if gate is not None:
        await gate.reserve_attempt()


async def _quota_is_final(response: httpx2.Response) -> None:
    # The SDK retries every 429; an exhausted quota will not come back in seconds.
    if response.status_code == 429:
        await response.aread()
        if b"insufficient_quota" in response.content:
            response.headers["x-should-retry"] = "false"


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


def describe_failure(exc: BaseException, timeout_s: float) -> tuple[str, bool]:
    """What an HTTP attempt's exception means, and whether it was a real timeout.

    Reads the whole ``__cause__``/``__context__`` chain: the SDK's ``APITimeoutError`` wraps an httpx error that
    wraps the aiohttp/OS error which says what happened (the aiohttp transport maps refused connections,
    resets and DNS failures to ``ConnectTimeout``).
    """
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, ReplyTooLargeError | httpx2.RemoteProtocolError):
            return str(e), False
        if isinstance(e, socket.gaierror) or type(e).__name__ == "ClientConnectorDNSError":
            return "DNS lookup failed (name not resolved)", False
        if isinstance(e, ssl.SSLError | ssl.CertificateError) or "SSL" in type(e).__name__:
            reasons = [x.reason for x in chain if isinstance(x, ssl.SSLError) and getattr(x, "reason", None)]
            detail = reasons[-1] if reasons else " ".join(str(e).split())[:120]  # the OpenSSL name, e.g. CERT_...
            return f"TLS error ({detail})", False
        if isinstance(e, ConnectionRefusedError):
            return "connection refused", False
        if isinstance(e, ConnectionResetError | BrokenPipeError):
            return "connection reset by the server", False
        if type(e).__name__ == "ServerDisconnectedError":
            return "the server closed the connection without answering", False
    for e in chain:
        if isinstance(e, TimeoutError | httpx2.TimeoutException):
            return f"no answer within {timeout_s:g} s", True
    for e in chain:
        if isinstance(e, OSError) and e.strerror:
            return f"connection error ({e.strerror})", False
    return f"connection error ({' '.join(str(exc).split())[:120] or type(exc).__name__})", False


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions under it (``__cause__``, else ``__context__``), at most 10."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(chain) < 10 and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


class _ObservedTransport(httpx2.AsyncBaseTransport):
    """Reports each HTTP attempt's outcome to the run's :data:`attempt_observer` (the circuit breaker)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, endpoint: str, timeout_s: float) -> None:
        self._inner = inner
        self._endpoint = endpoint
        self._timeout_s = timeout_s

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        observer = attempt_observer.get()
        if observer is not None:
            observer.attempt_sent()
        try:
            with map_reply_errors():
                if is_chat(request.url):
                    response = await self._chat(request)
                else:
                    response = await self._inner.handle_async_request(request)
        except Exception as exc:
            if observer is not None:
                cause, timed_out = describe_failure(exc, self._timeout_s)
                observer.attempt_failed(self._endpoint, cause, timed_out=timed_out)
            raise
        if observer is not None:
            if response.status_code >= 500:
                observer.attempt_failed(self._endpoint, f"HTTP {response.status_code}")
            elif response.status_code != 429:  # rate limiting says nothing about an outage
                observer.attempt_ok()
        return response

    async def _chat(self, request: httpx2.Request) -> httpx2.Response:
        """A chat-completion attempt within its deadline, its reply read whole and bounded (:func:`read_reply`)."""
        async with attempt_deadline(self._timeout_s):
            response = await self._inner.handle_async_request(request)
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
        await self._inner.aclose()


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


def _session_of(transport: Any) -> Callable[[], aiohttp.ClientSession]:
    """The session the SDK's aiohttp transport would make (its ``get_client``), on :class:`_NoStrayBytesConnector`."""

    def make() -> aiohttp.ClientSession:
        limits = transport.limits
        connector = _NoStrayBytesConnector(
            keepalive_timeout=limits.keepalive_expiry, ssl=transport.ssl_context,
            local_addr=(transport.local_address, 0) if transport.local_address else None,
            **({"limit": limits.max_connections} if limits.max_connections is not None else {}),
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
    every attempt observed (:class:`_ObservedTransport`) and counted (``_attempts``)."""
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
    from openai._vendor.httpx_aiohttp.transport import AiohttpTransport  # openai[aiohttp] >= 3.0 has it

    for transport in (http._transport, *http._mounts.values()):
        if isinstance(transport, AiohttpTransport) and transport.uds is None:
            transport.client = _session_of(transport)  # made on first use, as the transport's own
    # every attempt goes through one of these transports (the mounts: proxies from HTTP(S)_PROXY)
    http._transport = _ObservedTransport(http._transport, endpoint, timeout_s)
    http._mounts = {
        pattern: None if t is None else _ObservedTransport(t, endpoint, timeout_s)
        for pattern, t in http._mounts.items()
    }
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


def translate_error(
    exc: Exception, endpoint: str, model: str, api_key: str, max_retries: int, timeout_s: float
) -> Exception:
    """Map SDK errors to recall-bench's typed errors with a message that says what to fix."""
    where = endpoint
    text = redact(_error_text(exc), extra=[api_key] if api_key else ())
    status = getattr(exc, "status_code", None)
    if isinstance(exc, openai.AuthenticationError):
        return JudgeConfigError(
            f"{where} rejected the API key (401): set OPENAI_API_KEY (AZURE_OPENAI_API_KEY for Azure) to a "
            f"valid key for this endpoint. {text}",
            model=model,
            status=401,
        )
    if isinstance(exc, openai.PermissionDeniedError):
        return JudgeConfigError(f"{where} denied access to model {model} (403): {text}", model=model, status=403)
    if isinstance(exc, openai.NotFoundError):
        return JudgeConfigError(
            f"{where} does not serve model {model!r} (404): check --model and --base-url. {text}",
            model=model,
            status=404,
        )
    if isinstance(exc, openai.RateLimitError):
        if "insufficient_quota" in text:
            return JudgeConfigError(
                f"{where}: quota exhausted (insufficient_quota); add credit or use another key. {text}",
                model=model,
                status=429,
            )
        return JudgeTransientError(
            f"{where} kept rate-limiting (429) after {max_retries} retries; lower --max-concurrency "
            f"or set requests_per_minute. {text}",
            model=model,
            status=429,
        )
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError included: the chain says what happened
        cause, timed_out = describe_failure(exc, timeout_s)
        cause = redact(cause, extra=[api_key] if api_key else ())
        if timed_out or any(isinstance(e, ReplyTooLargeError | httpx2.RemoteProtocolError) for e in _chain(exc)):
            return JudgeTransientError(f"{where}: {cause} ({max_retries} retries)", model=model)
        return JudgeTransientError(f"cannot connect to {where}: {cause} ({max_retries} retries)", model=model)
    if isinstance(exc, openai.APIStatusError) and status is not None and status >= 500:
        return JudgeTransientError(
            f"{where} failed with {status} after {max_retries} retries: {text}",
            model=model,
            status=status,
        )
    if isinstance(exc, openai.APIStatusError):  # 400, 413, 422...: this request's, not the run's (the breaker decides)
        return JudgeRejectedError(f"{where} rejected the request ({status}): {text}", model=model, status=status)
    return JudgeTransientError(f"judge call failed: {text}", model=model)


_TITLE = re.compile(r"<title>(.*?)</title>", re.I | re.S)


def _error_text(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            parts = [str(error.get(k)) for k in ("message", "code", "param") if error.get(k)]
            return "; ".join(parts) or json.dumps(error)[:300]
    if isinstance(body, str) and body.strip():  # a proxy's page (nginx's 413): its title, else its first words
        title = _TITLE.search(body)
        return " ".join((title.group(1) if title else re.sub(r"<[^>]*>", " ", body)).split())[:300]
    return str(getattr(exc, "message", None) or exc)[:300]
