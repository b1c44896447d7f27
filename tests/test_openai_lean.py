"""The lean chat path (``judges/_openai_lean.py``) against the SDK path, fault by fault, on the real fake server.

Each case runs the same fault once on the SDK path (the judge's lean path switched off on its loop state, as for
an Azure client) and once on the lean path, each after a warm-up call, and compares what a user and the circuit
breaker see: the error's type and text, the requests counted, every attempt the observer was told about, and the
requests the server received (bodies and headers).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from recall_tasks import ContextualRecall, OpenAIJudge, RecallCase
from recall_tasks.errors import JudgeError, MissingInputError
from recall_tasks.judges._openai_lean import LeanChat
from recall_tasks.judges.base import attempt_observer
from tests.fake_openai import Delay, Framed, Reset, Status

KEY = "sk-lean-0123456789"
CASE = RecallCase(
    input="Where is the tower?",
    expected_output="The tower is in Paris. It is tall.",
    retrieval_context=["The tower stands in Paris.", "It is 330 m tall."],
)
REPLY = {"verdicts": [{"id": 1, "chunk_ids": [1], "reason": "", "verdict": "yes"},
                      {"id": 2, "chunk_ids": [2], "reason": "", "verdict": "yes"}], "summary": ""}  # fmt: skip


class Recorder:
    """An attempt observer that keeps what it is told (the breaker's view)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def attempt_sent(self) -> None:
        self.events.append(("sent",))

    def attempt_ok(self) -> None:
        self.events.append(("ok",))

    def attempt_failed(self, endpoint: str, cause: str, *, timed_out: bool = False) -> None:
        self.events.append(("failed", endpoint, cause, timed_out))


def outcome(server: Any, lean: bool, faults: list[Any], **kw: Any) -> dict[str, Any]:
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=server.base_url, api_key=KEY, **kw)
    metric = ContextualRecall(judge=judge)
    lean_calls: list[bool] = []

    async def run() -> dict[str, Any]:
        if not lean:
            judge._state().lean = None
        server.set_responder(lambda body: json.dumps(REPLY))
        await metric.a_measure(CASE)
        server.reset()
        server.set_responder(lambda body: json.dumps(REPLY))
        server.enqueue(*faults)
        recorder = Recorder()
        token = attempt_observer.set(recorder)
        state = judge._state()
        lean_calls.append(state.lean is not None and await state.lean._ready())
        try:
            result = await metric.a_measure(CASE)
            got: dict[str, Any] = {"score": result.score, "requests": result.metadata.requests}
        except (JudgeError, MissingInputError) as exc:
            got = {"error": type(exc).__name__, "text": str(exc), "requests": getattr(exc, "requests", None)}
        finally:
            attempt_observer.reset(token)
            await judge.aclose()
        got["events"] = recorder.events
        got["bodies"] = [r["raw"] for r in server.chat_requests]
        got["headers"] = [{k: v for k, v in r["headers"].items() if k != "x-fake-query"} for r in server.chat_requests]
        return got

    got = asyncio.run(run())
    assert lean_calls == [lean], "the case did not take the path it tests"
    return got


FAULTS = {
    "401": ([Status(401)], {}),
    "404": ([Status(404)], {}),
    "400": ([Status(400, message="messages too long")], {}),
    "insufficient_quota": ([Status(429, code="insufficient_quota")], {}),
    "429_exhausted": ([Status(429, headers={"retry-after": "0.01"})] * 2, {}),
    "500_exhausted": ([Status(500, headers={"retry-after": "0.01"})] * 2, {}),
    "503_then_ok": ([Status(503, headers={"retry-after": "0.01"})], {}),
    "reset": ([Reset(), Reset()], {}),
    "reset_then_ok": ([Reset()], {}),
    "timeout": ([Delay(1.0), Delay(1.0)], {"timeout_s": 0.3}),
    "not_a_completion": ([Status(200, body="<html>maintenance</html>")], {}),
    "gzip": ([Framed(encoding="gzip")], {}),
    "deflate": ([Framed(encoding="deflate")], {}),
    "chunked_then_close": ([Framed(chunked=True, close=True)], {}),
    "body_until_close": ([Framed(eof=True)], {}),
    "gzip_500_chunked": ([Status(500, headers={"retry-after": "0.01"}), Framed(encoding="gzip", chunked=True)], {}),
    "brotli": ([Framed(encoding="br")], {}),
    "brotli_429": ([Status(429, headers={"retry-after": "0.01"}), Framed(encoding="br", chunked=True)], {}),
    "interim_1xx_replies": ([Framed(informational=True)], {}),
    "huge_header": ([Framed(header_bytes=100_000)] * 2, {}),
    "too_many_headers": ([Framed(header_count=300)] * 2, {}),
    "trickled": ([Framed(trickle_s=0.05)] * 2, {"timeout_s": 0.4}),
    "gzip_bomb": ([Framed(bomb=64 * 2**20)] * 2, {}),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_lean_path_answers_every_fault_as_the_sdk_does(fake_openai, name):
    faults, kw = FAULTS[name]
    kw = {"max_retries": 1, "timeout_s": 5, **kw}
    sdk = outcome(fake_openai, False, faults, **kw)
    lean = outcome(fake_openai, True, faults, **kw)
    assert lean == sdk
    assert sdk["events"], "the observer saw no attempt"


def test_the_lean_path_is_not_taken_with_a_proxy(fake_openai, monkeypatch):
    """HTTP(S)_PROXY mounts a proxy transport: the SDK keeps every request (aiohttp's session would bypass it)."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=fake_openai.base_url, api_key=KEY)

    async def lean() -> LeanChat | None:
        try:
            return judge._state().lean
        finally:
            await judge.aclose()

    assert asyncio.run(lean()) is None
