"""A real HTTP server speaking the OpenAI chat-completions API, used as a scripted LLM judge in tests.

Server side is stdlib only (``http.server.ThreadingHTTPServer`` in a daemon thread).  It listens on
``127.0.0.1`` on a random free port, speaks HTTP/1.1 with keep-alive and sends ``Content-Length`` (a ``Framed``
fault answers chunked, compressed or closing instead),
so the real ``openai`` SDK (sync or async) can fire hundreds of concurrent requests at it.

Typical use::

    srv = FakeOpenAI().start()
    srv.set_responder(lambda body: '{"verdicts": [], "summary": "ok"}')
    srv.enqueue(Status(429, headers={"retry-after": "0.05"}), Reset(), Content('{"verdicts": [', "length"))
    client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test")
    ...
    srv.stop()

Per request, in order: queued faults (FIFO, one per request) -> ``reject_json_schema`` -> random faults
(``fault_rate`` / ``malformed_rate``) -> the responder.  Every request is recorded in ``requests`` (also
those answered with a fault), in arrival order.

``rpm_quota = N`` (a provider's requests-per-minute quota, enforced like a sliding window): at most
``N × quota_window_s / 60`` chat requests are accepted in any ``quota_window_s`` (10 s) window; beyond it the
request is answered 429 (``rate_limit_exceeded``) with a ``Retry-After`` of the time until the window has room,
before any other fault or the responder, and does not use the quota. ``quota_429s`` counts them,
``quota_accepted`` holds the arrival times (``time.monotonic()``) of the accepted ones.

``tpm_quota = N`` (a provider's tokens-per-minute quota over a sliding minute): a chat request whose prompt tokens
(as its ``usage`` reports them) would bring the last ``tpm_window_s`` (60 s) of accepted prompt tokens over ``N``
is answered 429 (``Retry-After``: until enough has left the window) and does not use the quota; ``tpm_429s``
counts them, ``tpm_accepted`` holds ``(arrival, prompt tokens)`` of the accepted ones (:meth:`busiest_tokens`).

``hang = True`` (an outage that accepts connections and never answers): every chat request is recorded, then
held without an answer until ``hang`` is cleared, :meth:`FakeOpenAI.reset` or :meth:`FakeOpenAI.stop`; the
connection is then dropped.

Batch API (``/v1/files`` and ``/v1/batches``, see :class:`FakeOpenAI`'s ``batch_*`` attributes): an uploaded JSONL
(multipart, ``purpose=batch``) is processed line by line with the same responder the chat endpoint uses (not
recorded as chat requests: a batch's lines are not live calls), the output file in shuffled order, failed lines in
an error file. ``batch_supported = False`` answers 404 on both routes (vLLM's OpenAI server has neither). The list
routes answer as OpenAI's do: newest first, ``after`` / ``limit`` pagination with ``has_more`` (batches 20 per page
by default, files 10,000; files also ``order=asc``), so code that takes list order for age meets production's
order here; file and batch objects carry the real API's fields.

Rejections and substitutions (per request, not queued; reset by :meth:`FakeOpenAI.reset`):
``prompt_tokens_of`` (``fn(message text) -> tokens``; default characters / 4) is the tokenizer of every count
below and of each completion's ``usage``, live and in a batch's output (a CJK tokenizer's counts, say).
``context_window = N`` answers a chat request whose prompt tokens (its ``usage``'s count: message characters / 4)
plus its completion budget (``max_completion_tokens`` / ``max_tokens``) exceed ``N`` with OpenAI's
``400 context_length_exceeded``; ``max_body_bytes = N`` answers a request body over ``N`` bytes with a proxy's
``413`` (an nginx HTML page, not JSON); ``reply_model`` (a name, or ``fn(body) -> name | None``) names another
model in the completion's ``model`` field, as a gateway falling back to another model does (a responder's dict may
say ``"model"`` too).
"""

from __future__ import annotations

import bisect
import contextlib
import email.parser
import email.policy
import functools
import gzip
import itertools
import json
import os
import random
import socket
import ssl
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest

__all__ = [
    "DEFAULT_CONTENT",
    "Content",
    "Delay",
    "FakeOpenAI",
    "Reset",
    "Responder",
    "Status",
    "error_body",
    "extract_user_text",
    "fake_openai",
    "fake_openai_server",
]

#: Content returned when no responder is set.
DEFAULT_CONTENT = '{"verdicts": [], "summary": ""}'

#: ``fn(body) -> str | dict``: the assistant content, or a dict with optional keys ``content``,
#: ``finish_reason`` ("stop" | "length"), ``status`` (int), ``headers`` (dict) and ``json`` (raw body).
Responder = Callable[[dict[str, Any]], "str | dict[str, Any] | None"]


# --------------------------------------------------------------------------------------------- faults


@dataclass
class Status:
    """Answer with HTTP ``status`` and an OpenAI-shaped error body.

    ``body`` (dict/str/bytes) replaces the error body entirely; otherwise ``message``, ``type`` and
    ``code`` (e.g. "rate_limit_exceeded", "insufficient_quota", "invalid_api_key") fill it, with
    defaults that depend on the status.  ``headers`` are added to the response (e.g. ``retry-after``).
    """

    status: int
    body: dict[str, Any] | str | bytes | None = None
    headers: dict[str, str] | None = None
    code: str | None = None
    message: str | None = None
    type: str | None = None
    param: str | None = None


@dataclass
class Delay:
    """Sleep ``seconds`` before answering normally (e.g. to go past a client timeout)."""

    seconds: float


@dataclass
class Reset:
    """Close the socket without answering (TCP RST: connection reset by peer)."""


@dataclass
class Content:
    """Answer 200 with exactly this assistant content (truncated JSON, prose, wrong shapes...)."""

    text: str
    finish_reason: str = "stop"


@dataclass
class Framed:
    """Answer normally, framed on the wire as given: the body compressed (``encoding`` "gzip" | "deflate" | "br"),
    sent in chunks (``chunked``), and/or the connection closed after the reply (``close``: ``Connection: close``);
    or a misbehaving server's reply (the fields after ``eof``)."""

    encoding: str | None = None
    chunked: bool = False
    close: bool = False
    drop: bool = False  # close the connection after the reply without saying so (an idle keep-alive timeout)
    eof: bool = False  # no Content-Length: the body ends when the connection closes
    trickle_s: float = 0.0  # the body sent one byte at a time, this long apart (each read well within a timeout)
    bomb: int = 0  # the body replaced by this many zero bytes, gzip-compressed (a decompression bomb)
    informational: bool = False  # a 100 Continue and a 103 Early Hints reply before the final one
    header_bytes: int = 0  # one header this long
    header_count: int = 0  # this many extra headers
    trailing: bytes = b""  # bytes written after the reply on the same keep-alive connection (a second "reply")


Fault = Status | Delay | Reset | Content | Framed

_framing = threading.local()  # the Framed fault of the request this handler thread is answering

_ERROR_DEFAULTS: dict[int, tuple[str, str, str | None]] = {
    # status: (message, type, code)
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided: sk-test. ", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to access this resource.", "permission_error", None),
    404: ("The requested resource does not exist.", "invalid_request_error", "not_found"),
    408: ("Request timed out.", "timeout", None),
    409: ("Conflict.", "invalid_request_error", None),
    422: ("Unprocessable entity.", "invalid_request_error", None),
    429: ("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
    504: ("Gateway timeout.", "server_error", None),
}

_CODE_DEFAULTS: dict[str, tuple[str, str]] = {
    # code: (message, type)
    "insufficient_quota": (
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota",
    ),
    "rate_limit_exceeded": ("Rate limit reached for requests. Please try again later.", "requests"),
    "invalid_api_key": ("Incorrect API key provided: sk-test. ", "invalid_request_error"),
    "context_length_exceeded": (
        "This model's maximum context length is 8192 tokens. Please reduce the length of the messages.",
        "invalid_request_error",
    ),
}


def error_body(
    status: int,
    *,
    message: str | None = None,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """An OpenAI-shaped error body ``{"error": {"message", "type", "param", "code"}}``."""
    d_message, d_type, d_code = _ERROR_DEFAULTS.get(
        status, (f"HTTP {status}", "server_error" if status >= 500 else "invalid_request_error", None)
    )
    if code is None:
        code = d_code
    elif code in _CODE_DEFAULTS:
        d_message, d_type = _CODE_DEFAULTS[code]
    return {
        "error": {
            "message": message if message is not None else d_message,
            "type": type if type is not None else d_type,
            "param": param,
            "code": code,
        }
    }


# --------------------------------------------------------------------------------------------- helpers


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def _quarter(text: str) -> int:
    """The fake's default token count: a token per four characters."""
    return len(text) // 4


def extract_user_text(body: dict[str, Any], roles: tuple[str, ...] | None = None) -> str:
    """Concatenate (``\\n``-joined) the text of the request's messages.

    ``content`` may be a string or a list of ``{"type": "text", "text": ...}`` parts.  ``roles`` restricts
    to some roles (e.g. ``("user",)``); by default every message (system, user, ...) is included.
    """
    texts = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        if roles is not None and msg.get("role") not in roles:
            continue
        texts.append(_content_text(msg.get("content")))
    return "\n".join(texts)


# --------------------------------------------------------------------------------------------- server


class _Reply:
    __slots__ = ("status", "payload", "headers")

    def __init__(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.payload = payload
        self.headers = headers or {}


class _ResetConnection:
    """Sentinel reply: drop the connection."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:  # quiet: clients go away
        pass

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        if self.fake.tls is not None:  # the handshake runs in the handler's thread (setup): a failed one is closed
            sock = self.fake.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeOpenAI/1.0"
    sys_version = ""
    timeout = 120  # idle keep-alive connections are closed after this many seconds
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
        super().setup()
        fake = self.server.fake
        with fake._lock:
            fake.stats["connections"] += 1  # TCP connections accepted (keep-alive reuse shows here)

    # -- plumbing

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, reply: _Reply) -> None:
        payload = reply.payload
        if isinstance(payload, bytes):
            data, ctype = payload, "application/octet-stream"
        elif isinstance(payload, str):
            data, ctype = payload.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(payload).encode(), "application/json"
        headers = {"content-type": ctype, "x-request-id": f"req_{next(self.server.fake._ids):08d}"}
        headers.update({k.lower(): str(v) for k, v in reply.headers.items()})
        framed: Framed | None = getattr(_framing, "fault", None)
        _framing.fault = None
        if framed is not None and framed.bomb:
            data, headers["content-encoding"] = _bomb(framed.bomb), "gzip"
        elif framed is not None and framed.encoding:
            data = _compress(framed.encoding, data)
            headers["content-encoding"] = framed.encoding
        if framed is not None and framed.header_bytes:
            headers["x-padding"] = "a" * framed.header_bytes
        for i in range(framed.header_count if framed is not None else 0):
            headers[f"x-extra-{i}"] = str(i)
        if framed is not None and framed.informational:  # interim replies, before the final one
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nlink: </v1/models>; rel=preload\r\n\r\n")
        if framed is not None and framed.close:
            headers["connection"] = "close"
        if framed is not None and (framed.drop or framed.eof):
            self.close_connection = True
        if framed is not None and framed.eof:
            pass
        elif framed is not None and framed.chunked:
            headers["transfer-encoding"] = "chunked"
        else:
            headers["content-length"] = str(len(data))
        self.send_response(reply.status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if framed is not None and framed.chunked:  # two chunks and the last, each flushed on its own
            half = len(data) // 2
            for part in (data[:half], data[half:], b""):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
        elif framed is not None and framed.trickle_s:
            for i in range(len(data)):
                if self.server.fake._stopping.wait(framed.trickle_s):
                    break
                self.wfile.write(data[i : i + 1])
        else:  # with the stray bytes after it in the same write, as a server miscounting its body sends them
            self.wfile.write(data + framed.trailing if framed is not None else data)

    def _reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0), without answering."""
        self.close_connection = True
        sock = self.connection
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # rfile/wfile hold references to the socket object, so close the descriptor itself.
        with contextlib.suppress(OSError):
            os.close(sock.detach())

    def _handle(self, method: str) -> None:
        fake = self.server.fake
        last, idle = getattr(self, "_last_reply_at", None), fake.drop_idle_s
        if idle is not None and last is not None and time.monotonic() - last > idle:
            self._lost(fake)
            return
        try:
            self._answer(method)
        finally:
            self._last_reply_at = time.monotonic()

    def _lost(self, fake: FakeOpenAI) -> None:
        """A request on a connection idle past ``drop_idle_s``: a load balancer that forgot the connection lets it
        go nowhere (no answer, no reset) until the server is reset or stopped; then it is closed."""
        with fake._lock:
            fake.stats["lost:idle"] += 1
            gen = fake._generation
        while gen == fake._generation and not fake._stopping.wait(0.05):
            pass
        self.close_connection = True

    def _answer(self, method: str) -> None:
        raw = self._read_body()
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        body: Any
        if headers.get("content-type", "").startswith("multipart/form-data"):
            body = _parse_multipart(headers["content-type"], raw)
        else:
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
        query = dict(parse_qsl(self.path.split("?", 1)[1])) if "?" in self.path else {}
        headers["x-fake-query"] = json.dumps(query)
        reply = self.server.fake._dispatch(method, path, headers, body, raw)
        if isinstance(reply, _ResetConnection):
            self._reset()
        else:
            self._send(reply)

    def do_POST(self) -> None:
        self._handle("POST")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")


def _compress(encoding: str, data: bytes) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data)
    if encoding == "deflate":
        return zlib.compress(data)
    if encoding == "br":
        import brotli  # the dev extra's (the SDK offers br when it is installed)

        return bytes(brotli.compress(data))
    raise ValueError(f"no such encoding: {encoding}")


@functools.lru_cache(maxsize=2)
def _bomb(size: int) -> bytes:
    """``size`` zero bytes, gzip-compressed (64 MiB: ~65 KB)."""
    return gzip.compress(bytes(size), compresslevel=9)


def _page(items: list[dict[str, Any]], query: dict[str, Any], default_limit: int) -> dict[str, Any]:
    """One page of a list endpoint as OpenAI returns it: newest first (``order=asc`` for oldest first, files
    only), the items after the id ``after``, at most ``limit``, with ``first_id``, ``last_id`` and ``has_more``."""
    ordered = items if query.get("order") == "asc" else items[::-1]  # stored in creation order
    after = query.get("after")
    if after:
        ids = [item["id"] for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    limit = int(query.get("limit") or default_limit)
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}  # fmt: skip


def _parse_multipart(content_type: str, raw: bytes) -> dict[str, Any]:
    """A multipart/form-data body as ``{field: str}``, files as ``{field: (filename, bytes)}``."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw
    )
    out: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        filename = part.get_filename()
        out[str(name)] = (filename, data) if filename is not None else data.decode("utf-8", "replace")
    return out


_RANDOM_FAULTS = ("429", "500", "503", "reset")
#: A proxy's answer to a body over its limit (nginx's ``client_max_body_size``): HTML, not an OpenAI error body.
_NGINX_413 = (
    "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request "
    "Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
_MALFORMED_KINDS = ("truncated", "prose", "wrong_shape")


class FakeOpenAI:
    """Fake OpenAI chat-completions endpoint on ``127.0.0.1:<random port>``.

    ``responder(body) -> str | dict`` scripts the judge (see :data:`Responder`); without one the content
    is :data:`DEFAULT_CONTENT`.  ``latency_s`` is slept before every answer.  ``reject_json_schema``
    answers 400 to ``response_format.type == "json_schema"``.  ``fault_rate`` injects random
    429 (retry-after 0.05) / 500 / 503 / connection resets, and ``malformed_rate`` truncated or malformed
    content on that fraction of the remaining requests, drawn from ``random.Random(seed)`` under a lock
    (a fixed number of draws per request, so the counts are deterministic even under concurrency).

    ``stats`` counts outcomes: "connections" (accepted), "requests", "ok", "queued:<kind>", "fault:<429|500|503|reset>",
    "malformed:<kind>", "rejected:json_schema", "responder_error", "hang", "lost:idle" (``drop_idle_s``).  ``errors``
    keeps responder exceptions.
    The constructor settings are public attributes; :meth:`reset` restores them.

    Batch API controls (reset by :meth:`reset`): ``batch_supported`` (False: 404 on ``/files`` and ``/batches``);
    ``batch_hold`` (True: a created batch stays ``in_progress`` until :meth:`finish_batches`; False: it is processed
    when created and reads ``completed`` from the first retrieve on); ``batch_outcome`` ("completed" | "expired":
    only the first half of the lines answered, the rest in the error file as ``batch_expired`` | "failed": no
    output, ``errors`` set); ``batch_fail_line(custom_id, body) -> bool`` (those lines go to the error file with a
    500); ``batch_create_faults`` (statuses answered to the next ``POST /batches``, one each);
    ``batch_create_lost`` (likewise, but answered after the batch was created: a reply lost on the way back);
    ``batch_truncate_output`` (the output file is cut in the middle of its last line); ``batch_unknown_line`` (one
    output line for a custom_id that was never submitted). :meth:`cancel_batch_outside` cancels a batch as if
    someone did it in the provider's console. ``files`` and ``batches`` hold what was uploaded and created.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        latency_s: float = 0.0,
        *,
        reject_json_schema: bool = False,
        fault_rate: float = 0.0,
        malformed_rate: float = 0.0,
        seed: int | None = None,
        model_id: str = "gpt-4o-mini",
        hang: bool = False,
        rpm_quota: int | None = None,
        tpm_quota: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tls = tls  # a server-side context: the server speaks HTTPS (base_url https://)
        #: a keep-alive connection idle longer than this loses its next request silently (see ``_Handler._lost``)
        self.drop_idle_s: float | None = None
        self._defaults = {
            "rpm_quota": rpm_quota,
            "tpm_quota": tpm_quota,
            "responder": responder,
            "latency_s": latency_s,
            "reject_json_schema": reject_json_schema,
            "fault_rate": fault_rate,
            "malformed_rate": malformed_rate,
            "hang": hang,
        }
        self.hang = hang
        self.context_window: int | None = None
        self.prompt_tokens_of: Callable[[str], int] = _quarter
        self.max_body_bytes: int | None = None
        self.reply_model: str | Callable[[dict[str, Any]], str | None] | None = None
        self.rpm_quota = rpm_quota
        self.quota_window_s = 10.0
        self.quota_accepted: list[float] = []  # arrivals of chat requests within the quota (rpm_quota set)
        self.quota_429s = 0
        self.tpm_quota = tpm_quota
        self.tpm_window_s = 60.0
        self.tpm_accepted: list[tuple[float, int]] = []  # (arrival, prompt tokens) within the token quota
        self.tpm_429s = 0
        self.responder: Responder | None = responder
        self.latency_s = latency_s
        self.record = True  # benchmarks turn this off: request bodies are not kept
        self.reject_json_schema = reject_json_schema
        self.fault_rate = fault_rate
        self.malformed_rate = malformed_rate
        self.seed = seed
        self.model_id = model_id
        #: answer ``GET /models`` with this status instead of the model list (e.g. 401, or 404: no such route)
        self.models_reply: Status | None = None
        self.requests: list[dict[str, Any]] = []
        self.chat_arrivals: list[float] = []  # time.monotonic() of each chat request's arrival, recorded or not
        #: the ``usage`` each chat completion answered with (prompt, completion tokens): what a client is billed
        self.usage_reported: list[tuple[int, int]] = []
        self.errors: list[BaseException] = []
        self.stats: Counter[str] = Counter()
        self._faults: list[Fault] = []
        self.files: dict[str, dict[str, Any]] = {}  # id -> {"meta": file object, "data": bytes}
        self.batches: dict[str, dict[str, Any]] = {}  # id -> batch object
        self._batch_defaults()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._generation = 0  # bumped by reset(): late answers of older requests leave no trace
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int = 0
        self.base_url: str = ""

    # -- lifecycle

    def start(self) -> FakeOpenAI:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self.base_url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-openai-{self.port}"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()  # wakes up Delay / latency sleeps
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting

    def reset(self) -> None:
        """Clear recorded requests, queued faults, stats and errors; restore constructor settings."""
        with self._lock:
            self.requests.clear()
            self.chat_arrivals.clear()
            self.usage_reported.clear()
            self.quota_accepted.clear()
            self.quota_429s = 0
            self.tpm_accepted.clear()
            self.tpm_429s = 0
            self._faults.clear()
            self.errors.clear()
            self.stats.clear()
            self._rng = random.Random(self.seed)
            self._generation += 1
            self.models_reply = None
            self.drop_idle_s = None
            self.context_window = self.max_body_bytes = self.reply_model = None
            self.prompt_tokens_of = _quarter
            for name, value in self._defaults.items():
                setattr(self, name, value)
            self.files.clear()
            self.batches.clear()
            self._batch_defaults()

    def _batch_defaults(self) -> None:
        self.batch_supported = True
        self.batch_hold = False
        self.batch_outcome = "completed"
        self.batch_fail_line: Callable[[str, dict[str, Any]], bool] | None = None
        self.batch_create_faults: list[int] = []
        self.batch_create_lost: list[int] = []
        self.batch_truncate_output = False
        self.batch_unknown_line = False

    def set_responder(self, fn: Responder | None) -> None:
        self.responder = fn

    def enqueue(self, *faults: Fault) -> None:
        """Queue faults, consumed one per chat request (FIFO) before the responder is used."""
        for f in faults:
            if not isinstance(f, Status | Delay | Reset | Content | Framed):
                raise TypeError(f"not a fault: {f!r}")
        with self._lock:
            self._faults.extend(faults)

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Recorded requests to ``/v1/chat/completions`` only."""
        with self._lock:
            return [r for r in self.requests if r["path"].rstrip("/").endswith("/chat/completions")]

    def chat_requests_since(self, t: float) -> int:
        """How many chat requests arrived at or after ``t`` (``time.monotonic()``)."""
        with self._lock:
            return sum(1 for at in self.chat_arrivals if at >= t)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> bool:
        """Block until at least ``n`` requests were recorded; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= n, timeout=timeout)

    # -- Batch API: test controls

    def finish_batches(self, outcome: str | None = None) -> None:
        """Process every batch still ``validating``/``in_progress`` (``outcome``: default ``batch_outcome``)."""
        with self._lock:
            waiting = [b for b in self.batches.values() if b["status"] in ("validating", "in_progress")]
        for batch in waiting:
            self._process_batch(batch, outcome or self.batch_outcome)

    def cancel_batch_outside(self, batch_id: str) -> None:
        """Cancel a batch as someone outside recall-bench would (no output, status ``cancelled``)."""
        with self._lock:
            batch = self.batches[batch_id]
            batch.update(status="cancelled", cancelled_at=int(time.time()))

    @property
    def uploads(self) -> list[dict[str, Any]]:
        """The file objects uploaded with ``purpose=batch``, in order."""
        with self._lock:
            return [f["meta"] for f in self.files.values() if f["meta"]["purpose"] == "batch"]

    # -- Batch API: the routes

    def _new_file(self, filename: str, data: bytes, purpose: str) -> dict[str, Any]:
        file_id = f"file-fake{next(self._ids):08d}"
        meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "expires_at": None, "filename": filename, "purpose": purpose, "status": "processed",
                "status_details": None}  # fmt: skip
        with self._lock:
            self.files[file_id] = {"meta": meta, "data": data}
        return meta

    def _batch_route(self, method: str, norm: str, headers: dict[str, str], body: Any) -> _Reply | None:
        """The ``/v1/files`` and ``/v1/batches`` routes; None for any other path."""
        parts = norm.removeprefix("/v1").strip("/").split("/")
        if parts[0] not in ("files", "batches"):
            return None
        if not self.batch_supported:
            return _Reply(404, error_body(404, message=f"Unknown request URL: {method} {norm}.", code="unknown_url"))
        if parts[0] == "files":
            if method == "POST" and len(parts) == 1:
                if not isinstance(body, dict) or not isinstance(body.get("file"), tuple):
                    return _Reply(400, error_body(400, message="a multipart 'file' is required", param="file"))
                if body.get("purpose") != "batch":
                    return _Reply(400, error_body(400, message="only purpose=batch is faked", param="purpose"))
                filename, data = body["file"]
                for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
                    try:
                        item = json.loads(line)
                        assert isinstance(item, dict) and item.get("custom_id") and isinstance(item.get("body"), dict)
                    except (ValueError, AssertionError):
                        return _Reply(400, error_body(400, message=f"line {n} is not a batch request line"))
                return _Reply(200, self._new_file(filename or "upload.jsonl", data, "batch"))
            if method == "GET" and len(parts) == 1:
                query = json.loads(headers.get("x-fake-query") or "{}")
                with self._lock:
                    data = [f["meta"] for f in self.files.values()
                            if query.get("purpose") in (None, f["meta"]["purpose"])]  # fmt: skip
                return _Reply(200, _page(data, query, default_limit=10_000))
            stored = self.files.get(parts[1])
            if stored is None:
                return _Reply(404, error_body(404, message=f"No such File object: {parts[1]}"))
            if method == "GET" and len(parts) == 3 and parts[2] == "content":
                return _Reply(200, stored["data"])
            if method == "GET" and len(parts) == 2:
                return _Reply(200, stored["meta"])
            return _Reply(404, error_body(404, message=f"Unknown request URL: {method} {norm}."))
        # batches
        if method == "POST" and len(parts) == 1:
            with self._lock:
                fault = self.batch_create_faults.pop(0) if self.batch_create_faults else None
            if fault is not None:
                return _Reply(fault, error_body(fault))
            if not isinstance(body, dict) or body.get("input_file_id") not in self.files:
                return _Reply(400, error_body(400, message="input_file_id names no uploaded file"))
            if body.get("endpoint") != "/v1/chat/completions":
                return _Reply(400, error_body(400, message="only /v1/chat/completions is faked", param="endpoint"))
            batch = {
                "id": f"batch_fake{next(self._ids):08d}", "object": "batch", "endpoint": body["endpoint"],
                "errors": None, "input_file_id": body["input_file_id"],
                "completion_window": body.get("completion_window", "24h"), "status": "validating",
                "output_file_id": None, "error_file_id": None, "created_at": int(time.time()),
                "in_progress_at": None, "expires_at": int(time.time()) + 86400, "finalizing_at": None,
                "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
                "cancelled_at": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": body.get("metadata"),
            }  # fmt: skip
            with self._lock:
                self.batches[batch["id"]] = batch
                self.stats["batch:create"] += 1
            reply = dict(batch)
            with self._lock:
                lost = self.batch_create_lost.pop(0) if self.batch_create_lost else None
            if self.batch_hold:
                batch["status"] = "in_progress"
                batch["in_progress_at"] = int(time.time())
            else:
                self._process_batch(batch, self.batch_outcome)
            return _Reply(lost, error_body(lost)) if lost is not None else _Reply(200, reply)
        if method == "GET" and len(parts) == 1:
            query = json.loads(headers.get("x-fake-query") or "{}")
            with self._lock:
                return _Reply(200, _page([dict(b) for b in self.batches.values()], query, default_limit=20))
        batch = self.batches.get(parts[1])
        if batch is None:
            return _Reply(404, error_body(404, message=f"No such Batch object: {parts[1]}"))
        if method == "GET" and len(parts) == 2:
            with self._lock:
                return _Reply(200, dict(batch))
        if method == "POST" and len(parts) == 3 and parts[2] == "cancel":
            with self._lock:
                if batch["status"] in ("validating", "in_progress"):
                    batch.update(status="cancelled", cancelled_at=int(time.time()))
                self.stats["batch:cancel"] += 1
                return _Reply(200, dict(batch))
        return _Reply(404, error_body(404, message=f"Unknown request URL: {method} {norm}."))

    def _process_batch(self, batch: dict[str, Any], outcome: str) -> None:
        """Answer a batch's lines with the responder: output (shuffled) and error files, final status."""
        lines = [json.loads(x) for x in self.files[batch["input_file_id"]]["data"].decode().splitlines() if x]
        now = int(time.time())
        if outcome == "failed":
            told = {"code": "invalid_request", "message": "the fake was told to fail this batch", "line": None}
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": [told]})
            batch["request_counts"] = {"total": len(lines), "completed": 0, "failed": 0}
            return
        answered = len(lines) if outcome == "completed" else len(lines) // 2
        out, errors = [], []
        for k, item in enumerate(lines):
            if k >= answered:
                expired = {"code": "batch_expired", "message": "This request could not be executed in the window."}
                errors.append({"id": f"batch_req_{next(self._ids):08d}", "custom_id": item["custom_id"],
                               "response": None, "error": expired})  # fmt: skip
                continue
            fail = self.batch_fail_line is not None and self.batch_fail_line(item["custom_id"], item["body"])
            status, payload = (500, error_body(500)) if fail else self._batch_answer(item["body"])
            line = {"id": f"batch_req_{next(self._ids):08d}", "custom_id": item["custom_id"],
                    "response": {"status_code": status, "request_id": f"req_{next(self._ids):08d}", "body": payload},
                    "error": None}  # fmt: skip
            (out if status == 200 else errors).append(line)
        if self.batch_unknown_line:
            stray = self._completion({}, DEFAULT_CONTENT, "stop", live=False).payload
            out.append({"id": "batch_req_unknown", "custom_id": "not-a-key-we-sent", "error": None,
                        "response": {"status_code": 200, "body": stray}})  # fmt: skip
        with self._lock:
            random.Random(self.seed).shuffle(out)
        text = "".join(json.dumps(x) + "\n" for x in out)
        if self.batch_truncate_output and text:
            text = text[: len(text) - max(2, len(text.rsplit("\n", 2)[-2]) // 2)]
        output = self._new_file(f"{batch['id']}_output.jsonl", text.encode(), "batch_output") if out else None
        error = self._new_file(f"{batch['id']}_error.jsonl", "".join(json.dumps(x) + "\n" for x in errors).encode(),
                               "batch_output") if errors else None  # fmt: skip
        with self._lock:
            if batch["status"] == "cancelled":  # cancelled while it was being processed
                return
            batch.update(
                status="completed" if outcome == "completed" else "expired",
                output_file_id=output["id"] if output else None,
                error_file_id=error["id"] if error else None,
                request_counts={"total": len(lines), "completed": len(out), "failed": len(errors)},
                **({"completed_at": now} if outcome == "completed" else {"expired_at": now}),
            )
            self.stats["batch:processed"] += 1

    def _batch_answer(self, body: dict[str, Any]) -> tuple[int, Any]:
        """One batch line answered like a chat request by the responder (no faults, no latency)."""
        try:
            out = self.responder(body) if self.responder is not None else DEFAULT_CONTENT
        except Exception as exc:  # noqa: BLE001 - a line error, kept for the test
            self.errors.append(exc)
            return 500, error_body(500, message=f"fake responder raised {type(exc).__name__}: {exc}")
        if out is None:
            out = DEFAULT_CONTENT
        if isinstance(out, str):
            out = {"content": out}
        status = int(out.get("status", 200))
        if "json" in out:
            return status, out["json"]
        if status != 200:
            return status, error_body(status)
        reply = self._completion(
            body, str(out.get("content", DEFAULT_CONTENT)), str(out.get("finish_reason", "stop")), live=False
        )
        return 200, reply.payload

    # -- request handling (runs in handler threads)

    def _over_quota(self, now: float) -> float | None:
        """With ``rpm_quota``: None if the request fits the sliding window (it is counted), else seconds to wait."""
        if not self.rpm_quota:
            return None
        allowed = int(self.rpm_quota * self.quota_window_s / 60)
        start = bisect.bisect_right(self.quota_accepted, now - self.quota_window_s)
        if len(self.quota_accepted) - start < allowed:
            self.quota_accepted.append(now)
            return None
        return max(0.001, self.quota_accepted[len(self.quota_accepted) - allowed] + self.quota_window_s - now)

    # -- token quota (tpm_quota): prompt tokens over a sliding minute

    def _over_token_quota(self, now: float, body: Any) -> float | None:
        """With ``tpm_quota``: None if the request's prompt tokens fit the window (they are counted), else the
        seconds until enough tokens have left it."""
        if not self.tpm_quota or not isinstance(body, dict):
            return None
        tokens = self.prompt_tokens_of(extract_user_text(body))  # what the completion's usage reports as prompt_tokens
        window = [(at, n) for at, n in self.tpm_accepted if at > now - self.tpm_window_s]
        excess = sum(n for _, n in window) + tokens - self.tpm_quota
        if excess <= 0 or not window:  # a prompt larger than the whole quota goes into an empty window alone
            self.tpm_accepted.append((now, tokens))
            return None
        for at, n in window:
            excess -= n
            if excess <= 0:
                return max(0.001, at + self.tpm_window_s - now)
        return max(0.001, window[-1][0] + self.tpm_window_s - now)

    def busiest_tokens(self, window_s: float | None = None) -> int:
        """The most prompt tokens accepted in any ``window_s`` (default ``tpm_window_s``) under ``tpm_quota``."""
        window_s = self.tpm_window_s if window_s is None else window_s
        with self._lock:
            accepted = list(self.tpm_accepted)
        return max(
            (sum(n for at, n in accepted[i:] if at <= t + window_s) for i, (t, _) in enumerate(accepted)), default=0
        )

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _dispatch(
        self, method: str, path: str, headers: dict[str, str], body: Any, raw: bytes = b""
    ) -> _Reply | _ResetConnection:
        norm = path.rstrip("/")
        # OpenAI (/v1/chat/completions) and Azure (/openai/deployments/<name>/chat/completions?api-version=...)
        is_chat = method == "POST" and norm.split("?", 1)[0].endswith("/chat/completions")
        with self._cond:
            if self.record:
                self.requests.append({"method": method, "path": path, "headers": headers, "body": body, "raw": raw})
            self.stats["requests"] += 1
            if is_chat:
                self.chat_arrivals.append(time.monotonic())
                over = self._over_quota(self.chat_arrivals[-1])
                if over is not None:
                    self.quota_429s += 1
                    self.stats["quota:429"] += 1
                    self._cond.notify_all()
                    return self._status_reply(Status(429, headers={"retry-after": f"{over:.3f}"}))
                over = self._over_token_quota(self.chat_arrivals[-1], body)
                if over is not None:
                    self.tpm_429s += 1
                    self.stats["tpm:429"] += 1
                    self._cond.notify_all()
                    return self._status_reply(Status(429, headers={"retry-after": f"{over:.3f}"}))
            fault = self._faults.pop(0) if is_chat and self._faults else None
            # always 4 draws per chat request: counts stay deterministic whatever the arrival order
            draws = [self._rng.random() for _ in range(4)] if is_chat else None
            self._cond.notify_all()
            # settings are snapshotted on arrival, so that a slow (Delay) request answered after a
            # reset() does not use the next test's responder
            gen = self._generation
            hang = self.hang and is_chat
            responder, latency_s = self.responder, self.latency_s
            reject_json_schema = self.reject_json_schema
            fault_rate, malformed_rate = self.fault_rate, self.malformed_rate
            window, max_body, reply_model = self.context_window, self.max_body_bytes, self.reply_model

        def count(key: str) -> None:
            with self._lock:
                if gen == self._generation:
                    self.stats[key] += 1

        if hang:  # accept, never answer: until the hang is lifted, the server reset or stopped
            count("hang")
            while self.hang and gen == self._generation and not self._stopping.wait(0.05):
                pass
            return _ResetConnection()

        self._sleep(latency_s)

        if method == "GET" and norm in ("/v1/models", "/models") and self.models_reply is not None:
            return self._status_reply(self.models_reply)
        if method == "GET" and norm in ("/v1/models", "/models"):
            return _Reply(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.model_id, "object": "model", "created": 0, "owned_by": "fake-openai"}],
                },
            )
        if not is_chat:
            batch_reply = self._batch_route(method, norm, headers, body)
            if batch_reply is not None:
                return batch_reply
            return _Reply(
                404,
                error_body(404, message=f"Unknown request URL: {method} {path}.", code="unknown_url"),
            )
        assert draws is not None

        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _Reply(400, error_body(400, message="'messages' is a required non-empty array.", param="messages"))
        if not body.get("model"):
            return _Reply(400, error_body(400, message="you must provide a model parameter", param="model"))
        if body.get("stream"):
            return _Reply(
                400,
                error_body(400, message="stream=true is not supported by the fake server", param="stream"),
            )
        if max_body is not None and len(raw) > max_body:  # a proxy in front of the model: its own page, not JSON
            count("rejected:413")
            return _Reply(413, _NGINX_413, {"content-type": "text/html"})
        if window is not None:
            prompt = self.prompt_tokens_of(extract_user_text(body))
            asked = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
            if prompt + asked > window:
                count("rejected:context_length")
                message = (
                    f"This model's maximum context length is {window} tokens. However, you requested "
                    f"{prompt + asked} tokens ({prompt} in the messages, {asked} in the completion). Please reduce "
                    "the length of the messages or completion."
                )
                return _Reply(400, error_body(400, message=message, code="context_length_exceeded", param="messages"))

        # 1. queued faults
        if fault is not None:
            count(f"queued:{type(fault).__name__.lower()}")
            if isinstance(fault, Reset):
                return _ResetConnection()
            if isinstance(fault, Status):
                return self._status_reply(fault)
            if isinstance(fault, Content):
                return self._completion(body, fault.text, fault.finish_reason)
            if isinstance(fault, Delay):
                self._sleep(fault.seconds)
            if isinstance(fault, Framed):
                _framing.fault = fault  # _send frames the normal answer

        # 2. json_schema rejection
        rf = body.get("response_format")
        if reject_json_schema and isinstance(rf, dict) and rf.get("type") == "json_schema":
            count("rejected:json_schema")
            return _Reply(
                400,
                {
                    "error": {
                        "message": "response_format json_schema is not supported by this model",
                        "type": "invalid_request_error",
                        "param": "response_format",
                        "code": None,
                    }
                },
            )

        # 3. random faults
        if fault is None and draws[0] < fault_rate:
            kind = _RANDOM_FAULTS[int(draws[1] * len(_RANDOM_FAULTS))]
            count(f"fault:{kind}")
            if kind == "reset":
                return _ResetConnection()
            if kind == "429":
                return self._status_reply(Status(429, headers={"retry-after": "0.05"}))
            return self._status_reply(Status(int(kind)))

        # 4. responder
        try:
            out = responder(body) if responder is not None else DEFAULT_CONTENT
        except Exception as exc:  # noqa: BLE001 - surfaced to the client as a 500, kept for the test
            with self._lock:
                if gen == self._generation:
                    self.errors.append(exc)
            count("responder_error")
            return _Reply(500, error_body(500, message=f"fake responder raised {type(exc).__name__}: {exc}"))
        if out is None:
            out = DEFAULT_CONTENT
        if isinstance(out, str):
            out = {"content": out}
        status = int(out.get("status", 200))
        extra_headers = dict(out.get("headers") or {})
        if "json" in out:
            return _Reply(status, out["json"], extra_headers)
        if status != 200:
            return _Reply(status, error_body(status), extra_headers)
        content = str(out.get("content", DEFAULT_CONTENT))
        finish_reason = str(out.get("finish_reason", "stop"))
        replied = out.get("model") or (reply_model(body) if callable(reply_model) else reply_model)

        if fault is None and draws[2] < malformed_rate:
            kind = _MALFORMED_KINDS[int(draws[3] * len(_MALFORMED_KINDS))]
            count(f"malformed:{kind}")
            if kind == "truncated":
                content, finish_reason = content[: max(1, len(content) // 2)], "length"
            elif kind == "prose":
                content = "I'm sorry, but I can't provide a structured assessment for this request."
            else:
                content = '["unexpected", "shape"]'
        else:
            count("ok")
        return self._completion(body, content, finish_reason, extra_headers, model=replied)

    @staticmethod
    def _status_reply(fault: Status) -> _Reply:
        if fault.body is not None:
            payload: Any = fault.body
        else:
            payload = error_body(
                fault.status, message=fault.message, type=fault.type, code=fault.code, param=fault.param
            )
        return _Reply(fault.status, payload, dict(fault.headers or {}))

    def _completion(
        self,
        body: dict[str, Any],
        content: str,
        finish_reason: str,
        headers: dict[str, str] | None = None,
        *,
        live: bool = True,
        model: str | None = None,
    ) -> _Reply:
        prompt_tokens = self.prompt_tokens_of(extract_user_text(body))
        completion_tokens = max(1, len(content) // 4)
        if live:  # a batch line's usage is in its output file, not a live reply
            with self._lock:
                self.usage_reported.append((prompt_tokens, completion_tokens))
        payload = {
            "id": f"chatcmpl-fake{next(self._ids):08d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model or body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "system_fingerprint": "fp_fake",
        }
        return _Reply(200, payload, headers)


# --------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def fake_openai_server() -> Iterator[FakeOpenAI]:
    """One fake OpenAI server for the whole test session."""
    srv = FakeOpenAI().start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def fake_openai(fake_openai_server: FakeOpenAI) -> FakeOpenAI:
    """The session server, reset (no requests, no faults, default responder) for this test."""
    fake_openai_server.reset()
    return fake_openai_server
