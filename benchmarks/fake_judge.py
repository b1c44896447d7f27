"""A fast fake OpenAI-compatible judge for benchmarks: fixed latency, unlimited concurrency, valid answers.

One event loop in its own process: HTTP/1.1 keep-alive connections parsed by httptools, bodies read and written
with orjson (the tests' thread-per-connection server adds ~60 ms of queueing at 100 in flight on two cores, and
aiohttp.web cost ~0.45 ms of CPU a request, about what the client it served cost: against a zero-latency judge
on the other core that measured the server, not the client). Every numbered
statement is answered "yes" with chunk 1; ``usage.prompt_tokens`` is characters / 4, as the test server.

It also answers ragas' context-recall prompt (``LLMContextRecall`` and ``metrics.collections.ContextRecall``,
ragas 0.4.3, for ``benchmarks/vs_ragas.py``): ragas renders its input model as JSON after "Now perform the same
with the following input" and expects ``{"classifications": [{"statement", "reason", "attributed"}]}``; every
sentence of the input's ``answer`` (the reference) is a statement, attributed 1, so both tools score every row 1.0.

    python -m benchmarks.fake_judge --latency 0.2 --ready-file /tmp/url
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import time
from typing import Any

import httptools
import orjson

_NUMBERED = re.compile(r'^\d+\. "', re.M)
_ITEMS = re.compile(r"^Context items to decide \((\d+)\)", re.M)
#: ragas' PydanticPrompt.to_string (and prompt.metrics.BasePrompt's): the row's input model as JSON between these
_RAGAS_INPUT = "\nNow perform the same with the following input\ninput: "
_RAGAS_OUTPUT = "\nOutput: "
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def ragas_context_recall(user: str) -> str | None:
    """The answer to ragas' context-recall prompt (every reference sentence attributed), None for other prompts."""
    start = user.rfind(_RAGAS_INPUT)
    if start < 0 or not user.endswith(_RAGAS_OUTPUT):
        return None
    fields = json.loads(user[start + len(_RAGAS_INPUT) : -len(_RAGAS_OUTPUT)])
    statements = [s for s in _SENTENCE_END.split(str(fields.get("answer", "")).strip()) if s]
    return json.dumps({"classifications": [{"statement": s, "reason": "", "attributed": 1} for s in statements]})


def answer(body: dict) -> tuple[str, int]:
    text = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
    user = str(body["messages"][-1].get("content", ""))
    ragas = ragas_context_recall(user)
    if ragas is not None:
        return ragas, len(text) // 4
    items = _ITEMS.search(user)
    n = int(items.group(1)) if items else len(_NUMBERED.findall(user))
    verdicts = [{"id": i, "chunk_ids": [1], "reason": "", "verdict": "yes"} for i in range(1, n + 1)]
    return json.dumps({"verdicts": verdicts, "summary": ""}), len(text) // 4


class Stats:
    """What a benchmark reads at ``GET /stats`` (``?reset=1`` clears it after reading).

    ``first_request_at``: wall-clock time (``time.time()``) of the first request since the last reset, so a
    benchmark in another process can measure its command's time to first judge request; ``last_response_at``: the
    same clock when the latest answer was sent (the end of a run's scoring window); ``prompt_tokens``: the sum of
    the requests' ``usage.prompt_tokens`` (characters / 4), for prompt tokens per row.

    ``GET /timeline`` (``?reset=1`` likewise): the arrival and answer times of the first :data:`TIMELINE_MAX`
    requests since the last reset, ``{"arrived": [...], "answered": [...]}`` (same clock): where a client's
    window loses time shows as gaps in the arrivals (``benchmarks/window_gaps.py``).
    """

    def __init__(self) -> None:
        self.values: dict[str, Any] = {
            "requests": 0, "in_flight": 0, "peak_in_flight": 0, "first_request_at": None, "last_response_at": None,
            "prompt_tokens": 0,
        }  # fmt: skip
        self.arrivals: list[float] = []
        self.answers: list[float] = []

    def arrived(self) -> None:
        v = self.values
        now = time.time()
        if v["first_request_at"] is None:
            v["first_request_at"] = now
        v["requests"] += 1
        v["in_flight"] += 1
        v["peak_in_flight"] = max(v["peak_in_flight"], v["in_flight"])
        if len(self.arrivals) < TIMELINE_MAX:
            self.arrivals.append(now)

    def answered(self, prompt_tokens: int) -> None:
        now = time.time()
        self.values["in_flight"] -= 1
        self.values["last_response_at"] = now
        self.values["prompt_tokens"] += prompt_tokens
        if len(self.answers) < TIMELINE_MAX:
            self.answers.append(now)

    def read(self, reset: bool) -> bytes:
        out = orjson.dumps(self.values)
        if reset:
            self.values.update(
                requests=0, peak_in_flight=0, first_request_at=None, last_response_at=None, prompt_tokens=0
            )
            self.arrivals, self.answers = [], []
        return out

    def timeline(self, reset: bool) -> bytes:
        out = orjson.dumps({"arrived": self.arrivals, "answered": self.answers})
        if reset:
            self.arrivals, self.answers = [], []
        return out


#: Requests whose times ``GET /timeline`` keeps (a million-row run would otherwise hold two floats a row).
TIMELINE_MAX = 100_000


def completion(body: dict) -> tuple[bytes, int]:
    """The chat-completion reply to a request body, and its prompt tokens."""
    content, prompt_tokens = answer(body)
    done = max(1, len(content) // 4)
    return orjson.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done},
    }), prompt_tokens  # fmt: skip


class _Http(asyncio.Protocol):
    """One keep-alive connection: requests parsed by httptools, each answered after the latency, in order."""

    def __init__(self, latency: float, stats: Stats) -> None:
        self.latency = latency
        self.stats = stats
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(400, b'{"error": "bad request"}', close=True)

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method, path, _, query = self.parser.get_method(), *self.url.partition(b"?")
        keep = self.parser.should_keep_alive()
        if method == b"POST" and path == b"/v1/chat/completions":
            self.stats.arrived()
            body = orjson.loads(b"".join(self.body))
            if self.latency > 0:
                asyncio.get_running_loop().call_later(self.latency, self._chat, body, keep)
            else:
                self._chat(body, keep)
        elif method == b"GET" and path == b"/stats":
            self._send(200, self.stats.read(reset=b"reset" in query), close=not keep)
        elif method == b"GET" and path == b"/timeline":
            self._send(200, self.stats.timeline(reset=b"reset" in query), close=not keep)
        else:
            self._send(404, b'{"error": {"message": "not found"}}', close=not keep)

    def _chat(self, body: dict, keep: bool) -> None:
        reply, prompt_tokens = completion(body)
        self.stats.answered(prompt_tokens)
        self._send(200, reply, close=not keep)

    def _send(self, status: int, payload: bytes, close: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}[status]
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
            status, reason, len(payload))  # fmt: skip
        self.transport.write(head + (b"connection: close\r\n\r\n" if close else b"\r\n") + payload)
        if close:
            self.transport.close()


async def serve(sock: socket.socket, latency: float, ready_file: str | None, url: str) -> None:
    stats = Stats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Http(latency, stats), sock=sock, backlog=4096)
    if ready_file:
        with open(ready_file, "w") as fh:
            fh.write(url)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    asyncio.run(serve(sock, args.latency, args.ready_file, url))


if __name__ == "__main__":
    main()
