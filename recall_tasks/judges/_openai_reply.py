"""A chat-completion reply, read whole and bounded within one deadline, and what a failed attempt means.

Split from :mod:`recall_tasks.judges._openai_http` (the clients), whose observed transport calls these on every
chat-completion attempt:

- Every chat-completion attempt has a deadline for the whole exchange (:func:`attempt_deadline`: connect, send,
  the reply's head and every byte of its body within ``timeout_s``; aiohttp's own timeouts are per read, so a
  reply trickled a byte at a time would hold the row without end) and a bounded reply (:func:`read_reply`:
  :data:`MAX_REPLY_BYTES` as sent and once decoded, decoded by httpx2's decoders, which is what the SDK's
  ``accept-encoding`` offers). Both fail the attempt, which the SDK's retry policy then retries (a timeout as a
  timeout).
- Error texts say what happened (:func:`describe_failure`), read from the exception chain under the SDK's error
  (the aiohttp transport maps a refused connection to a *timeout*): "connection refused", "DNS lookup failed",
  "TLS error", "no answer within N s" only for real timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2

#: The most a chat-completion reply may hold, as sent and once decoded. A verdict reply is a few KB: this only
#: stops a broken or hostile endpoint from holding the run's memory (a 65 KB gzip bomb decodes to 64 MiB).
MAX_REPLY_BYTES = 8 * 2**20


class ReplyTooLargeError(httpx2.ReadError):
    """A chat-completion reply over :data:`MAX_REPLY_BYTES` (as sent, or decoded): the attempt fails (an httpx2
    read error: the SDK retries it as it retries a reply cut short)."""


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
    ``read_all`` (the transport's, when it has one) reads a plain body whose Content-Length is within the bound in
    one call."""
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
