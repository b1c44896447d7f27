"""A fast fake OpenAI-compatible judge for benchmarks: fixed latency, unlimited concurrency, valid answers.

aiohttp.web on one event loop in its own process (the tests' thread-per-connection server adds ~60 ms of
queueing at 100 in flight on two cores, which would measure the server, not the client). Every numbered
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

from aiohttp import web

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


def make_app(latency: float) -> web.Application:
    # first_request_at: wall-clock time (time.time()) of the first request since the last reset, so a benchmark
    # in another process can measure its command's time to first judge request
    # last_response_at: the same clock when the latest answer was made (the end of a run's scoring window)
    stats: dict[str, Any] = {
        "requests": 0, "in_flight": 0, "peak_in_flight": 0, "first_request_at": None, "last_response_at": None,
    }  # fmt: skip

    async def chat(request: web.Request) -> web.Response:
        if stats["first_request_at"] is None:
            stats["first_request_at"] = time.time()
        stats["requests"] += 1
        stats["in_flight"] += 1
        stats["peak_in_flight"] = max(stats["peak_in_flight"], stats["in_flight"])
        try:
            body = await request.json()
            await asyncio.sleep(latency)
        finally:
            stats["in_flight"] -= 1
        content, prompt_tokens = answer(body)
        completion = max(1, len(content) // 4)
        stats["last_response_at"] = time.time()
        return web.json_response({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion},
        })  # fmt: skip

    async def read_stats(request: web.Request) -> web.Response:
        out = dict(stats)
        if request.query.get("reset"):
            stats["requests"] = stats["peak_in_flight"] = 0
            stats["first_request_at"] = stats["last_response_at"] = None
        return web.json_response(out)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", read_stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    app = make_app(args.latency)

    async def ready(_: web.Application) -> None:
        if args.ready_file:
            with open(args.ready_file, "w") as fh:
                fh.write(url)

    app.on_startup.append(ready)
    web.run_app(app, sock=sock, print=None, access_log=None, backlog=4096)


if __name__ == "__main__":
    main()
