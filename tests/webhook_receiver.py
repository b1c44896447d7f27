"""A real HTTP endpoint that records what a webhook sends it: the receiving end of the alert tests.

Stdlib only (``ThreadingHTTPServer`` in a daemon thread) on 127.0.0.1, a random free port. Every request is kept
as a :class:`Received` (method, path, headers, raw body, and the body parsed as JSON when it is JSON); the server
answers 200 ``{"ok": true}``. ``wait_for(n, timeout)`` waits until ``n`` requests have arrived.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fixture_scope import module_unless_repeated


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() on arrival (comparable with an event's ``occurred``)

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    """Records every request; ``url`` is the base URL (any path is accepted)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                got = Received(self.command, self.path, dict(self.headers.items()), body, time.time())
                with receiver._changed:
                    receiver.received.append(got)
                    receiver._changed.notify_all()
                reply = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_POST = do_PUT = do_GET = _record

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, n: int, timeout: float) -> list[Received]:
        """The requests once at least ``n`` arrived, or those that did after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.received) < n and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            return list(self.received)


@pytest.fixture(scope=module_unless_repeated)
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
