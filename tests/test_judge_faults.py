"""What a user and the circuit breaker see of each fault and framing of a reply, on the real fake server, against
golden values recorded at ``5af6bc7``, where the judge had two chat paths (the SDK's and a "lean" one) and
``tests/test_openai_lean.py`` proved them equal on every case below: the error's type and text, the requests
counted, every attempt the observer was told about, and the requests the server received (bodies and headers).

Since issue 57 there is one path, ``chat.completions.with_raw_response.create`` on the judge's own httpx2 client
(``judges/_openai_http.py``); the values are the two paths' common ones, so a change of retries, errors, counts,
breaker events or bytes sent fails here. The one difference allowed: the SDK marks a raw-response request with
``x-stainless-raw-response: true``, which the old paths did not send (checked here, and left out of the comparison).

Regenerate only for an intended change: ``PYTHONPATH=. python -m tests.test_judge_faults --record
tests/data/judge_faults.json`` (the endpoint's port and the headers naming the machine and the SDK's version are
normalised, the bodies kept as SHA-256 digests: ``tests/test_wire_golden.py`` holds their bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from recall_tasks import ContextualRecall, OpenAIJudge, RecallCase
from recall_tasks.errors import JudgeError, MissingInputError
from recall_tasks.judges.base import attempt_observer
from tests.fake_openai import Delay, FakeOpenAI, Framed, Reset, Status

GOLDEN = Path(__file__).parent / "data" / "judge_faults.json"
KEY = "sk-lean-0123456789"
CASE = RecallCase(
    input="Where is the tower?",
    expected_output="The tower is in Paris. It is tall.",
    retrieval_context=["The tower stands in Paris.", "It is 330 m tall."],
)
REPLY = {"verdicts": [{"id": 1, "chunk_ids": [1], "reason": "", "verdict": "yes"},
                      {"id": 2, "chunk_ids": [2], "reason": "", "verdict": "yes"}], "summary": ""}  # fmt: skip
#: headers whose values name the machine, the Python or the SDK's version, not what the judge asked for
ENVIRONMENT = frozenset(("user-agent", "x-stainless-package-version", "x-stainless-runtime-version",
                         "x-stainless-os", "x-stainless-arch", "x-stainless-runtime", "x-stainless-lang"))  # fmt: skip
RAW_MARK = "x-stainless-raw-response"


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


def _normalised(value: Any, endpoint: str) -> Any:
    """``value`` with the server's ``host:port`` written ``ENDPOINT`` (its port changes from run to run)."""
    return json.loads(json.dumps(value).replace(endpoint, "ENDPOINT"))


def outcome(server: FakeOpenAI, faults: list[Any], **kw: Any) -> dict[str, Any]:
    """One call after a warm-up call, ``faults`` queued: its score or error, the requests counted, the observer's
    events, and the chat requests the server received (bodies' digests, headers)."""
    kw = {"max_retries": 1, "timeout_s": 5, **kw}
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=server.base_url, api_key=KEY, **kw)
    metric = ContextualRecall(judge=judge)

    async def run() -> dict[str, Any]:
        server.set_responder(lambda body: json.dumps(REPLY))
        await metric.a_measure(CASE)
        server.reset()
        server.set_responder(lambda body: json.dumps(REPLY))
        server.enqueue(*faults)
        recorder = Recorder()
        token = attempt_observer.set(recorder)
        try:
            result = await metric.a_measure(CASE)
            got: dict[str, Any] = {"score": result.score, "requests": result.metadata.requests}
        except (JudgeError, MissingInputError) as exc:
            got = {"error": type(exc).__name__, "text": str(exc), "requests": getattr(exc, "requests", None)}
        finally:
            attempt_observer.reset(token)
            await judge.aclose()
        got["events"] = recorder.events
        got["bodies"] = [hashlib.sha256(r["raw"]).hexdigest() for r in server.chat_requests]
        skipped = ("host", "x-fake-query")  # the port; the fake server's own
        got["headers"] = [
            {k: "*" if k in ENVIRONMENT else v for k, v in sorted(r["headers"].items()) if k not in skipped}
            for r in server.chat_requests
        ]
        return got

    return _normalised(asyncio.run(run()), judge.endpoint)


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_answers_as_both_paths_did(fake_openai, name):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))[name]
    faults, kw = FAULTS[name]
    got = outcome(fake_openai, faults, **kw)
    assert got["events"], "the observer saw no attempt"
    assert all(h.pop(RAW_MARK) == "true" for h in got["headers"]), got["headers"]
    assert got == golden


if __name__ == "__main__":  # --record PATH: write the values of the checkout on PYTHONPATH
    with FakeOpenAI() as srv:
        values = {name: outcome(srv, faults, **kw) for name, (faults, kw) in FAULTS.items()}
    for value in values.values():  # the old paths sent no raw-response mark; the new one's is checked apart
        for headers in value["headers"]:
            headers.pop(RAW_MARK, None)
    Path(sys.argv[sys.argv.index("--record") + 1]).write_text(json.dumps(values, indent=1) + "\n", encoding="utf-8")
