"""The judge's wire bytes and results, compared with golden values recorded from ``60987c1`` (before the client's
CPU work of issue 24): every request body byte for byte as the fake server received it, and every score, reason,
verdict, token count, request count and cost, across the paths a reply can take (normal, no reasons, coverage,
repair, truncation, retries after 429/500, JSON-schema fallback, claims, the Batch API line).

Regenerate only for an intended wire change (and bump ``PROMPT_VERSION`` if the prompt changed):
``PYTHONPATH=. python -m tests.test_wire_golden --record tests/data/wire_golden.json``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from recall_tasks import ContextCoverage, ContextualRecall, OpenAIJudge, RecallCase
from tests.fake_openai import Content, FakeOpenAI, Status

GOLDEN = Path(__file__).parent / "data" / "wire_golden.json"
KEY = "sk-golden-0123456789"

EINSTEIN = RecallCase(
    input="Tell me about Einstein.",
    expected_output="Einstein was born in 1879. He developed relativity. He won the Nobel Prize.",
    retrieval_context=[
        "Document 1: Einstein was born on 14 March 1879 in Ulm, Germany.",
        "Document 2: Einstein published the theory of special relativity in 1905.",
        "Document 3: Einstein moved to the United States in 1933.",
    ],
)
UNICODE = RecallCase(
    input='Où est « la tour » ? 東京\n"quoted"',
    expected_output="La tour Eiffel est à Paris. Elle mesure 330 m. 東京タワーは東京にある。",
    actual_output="Elle est à Paris, « près de la Seine ». Elle mesure 330 m.",
    retrieval_context=["La tour Eiffel </chunk> se trouve à Paris.", "", "Tokyo Tower</answer> 333 m \u2028 sep"],
)
_NUMBERED = re.compile(r'^\d+\. "', re.M)
_ITEMS = re.compile(r"^(?:Sentences|Context items) to decide \((\d+)\)", re.M)


def _answer(body: dict[str, Any]) -> str:
    """Claims for an extraction; otherwise "yes" by chunk 1 for odd ids, "no" for even ones."""
    if "recall_claims" in json.dumps(body.get("response_format")) or "claims" in body["messages"][0]["content"][:200]:
        return json.dumps({"claims": ["Einstein was born in 1879.", "Einstein developed relativity."]})
    user = body["messages"][1]["content"]
    found = _ITEMS.search(user)
    n = int(found.group(1)) if found else len(_NUMBERED.findall(user))
    verdicts = [
        {"id": i, "chunk_ids": [1] if i % 2 else [], "reason": f"reason {i} ✓", "verdict": "yes" if i % 2 else "no"}
        for i in range(1, n + 1)
    ]
    return json.dumps({"verdicts": verdicts, "summary": "résumé"}, ensure_ascii=False)


def _result(r: Any) -> dict[str, Any]:
    md = r.metadata
    return {
        "score": r.score, "success": r.success, "reason": r.reason, "skipped": r.skipped,
        "verdicts": [v.model_dump() for v in r.verdicts],
        "tokens": [md.prompt_tokens, md.completion_tokens], "requests": md.requests, "cost_usd": md.cost_usd,
        "flags": md.flags, "precision": [md.context_precision, md.chunks_used, md.first_relevant_rank],
    }  # fmt: skip


def capture(server: FakeOpenAI) -> dict[str, Any]:
    """Run every scenario against ``server``; the bodies it received and the results, per scenario.

    Each judge makes one call (``EINSTEIN``) when it is made, before its scenario (``first_call_sdk_then_lean``
    records it too: its name is from the judge's former two chat paths, whose first request once took the SDK's);
    tests/test_judge_faults.py compares faults and framings with what both former paths did.
    """
    out: dict[str, Any] = {}

    def judge(**kw: Any) -> OpenAIJudge:
        kw.setdefault("max_retries", 3)
        j = OpenAIJudge(model="gpt-4o-mini", base_url=server.base_url, api_key=KEY, timeout_s=5, **kw)
        ContextualRecall(judge=j).measure(EINSTEIN)  # the warm-up call
        return j

    def scenario(name: str, run: Any, *faults: Any, reject_schema: bool = False) -> None:
        server.reset()
        server.set_responder(_answer)
        result = run(faults, reject_schema)
        bodies = [r["raw"].decode("utf-8") for r in server.chat_requests]
        for r in server.chat_requests:
            assert r["headers"]["authorization"] == f"Bearer {KEY}"
            assert r["headers"]["content-type"] == "application/json"
        out[name] = {"bodies": bodies, "result": result}

    def measured(metric: Any, case: RecallCase) -> Any:
        def run(faults: tuple[Any, ...], reject_schema: bool) -> Any:
            server.enqueue(*faults)
            server.reject_json_schema = reject_schema
            return _result(metric.measure(case))

        return run

    scenario("first_call_sdk_then_lean", lambda f, r: _result(ContextualRecall(judge=judge()).measure(UNICODE)))
    scenario("recall", measured(ContextualRecall(judge=judge()), EINSTEIN))
    scenario("unicode_no_reason", measured(ContextualRecall(judge=judge(), include_reason=False), UNICODE))
    scenario("coverage", measured(ContextCoverage(judge=judge()), UNICODE))
    scenario("repair", measured(ContextualRecall(judge=judge()), EINSTEIN), Content("no JSON here"))
    scenario("truncated", measured(ContextualRecall(judge=judge()), EINSTEIN), Content('{"ve', "length"))
    scenario(
        "retries",
        measured(ContextualRecall(judge=judge()), EINSTEIN),
        Status(429, headers={"retry-after": "0.01"}),
        Status(500, headers={"retry-after": "0.01"}),
    )
    scenario("fallback", measured(ContextualRecall(judge=judge()), EINSTEIN), reject_schema=True)
    official = judge(max_tokens_param="max_completion_tokens", temperature=None)
    scenario("official_no_temperature", measured(ContextualRecall(judge=official), EINSTEIN))
    scenario("claims", measured(ContextualRecall(judge=judge(), units="claims"), EINSTEIN))

    def many(faults: tuple[Any, ...], reject_schema: bool) -> list[dict[str, Any]]:
        from benchmarks.throughput import make_table

        table = make_table(12, seed=3).to_pylist()
        cases = [
            RecallCase(input=r["user_input"], expected_output=r["reference"], retrieval_context=r["retrieved_contexts"])
            for r in table
        ]
        metric = ContextualRecall(judge=judge(max_concurrency=8))

        async def run() -> list[Any]:
            return await asyncio.gather(*(metric.a_measure(c) for c in cases))

        return [_result(r) for r in asyncio.run(run())]

    scenario("many", many)
    out["many"]["bodies"] = sorted(out["many"]["bodies"])  # concurrent: arrival order varies
    prepared = ContextualRecall(judge=judge()).prepare(EINSTEIN, list(EINSTEIN.retrieval_context or []))
    out["batch_body"] = json.dumps(judge().batch_body(prepared.request), ensure_ascii=False)  # type: ignore[union-attr]
    return out


def test_request_bodies_and_results_equal_the_recorded_ones(fake_openai):
    """Fails on any change of a body's bytes (key order, separators, escaping) or of a result."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    got = capture(fake_openai)
    assert set(got) == set(golden)
    for name, want in golden.items():
        if name == "batch_body":
            assert got[name] == want
            continue
        assert len(got[name]["bodies"]) == len(want["bodies"]), name
        for i, (a, b) in enumerate(zip(got[name]["bodies"], want["bodies"], strict=True)):
            assert a == b, f"{name}: body {i} differs"
        assert got[name]["result"] == want["result"], name


if __name__ == "__main__":  # --record PATH: write the golden values of the checkout on PYTHONPATH
    with FakeOpenAI() as srv:
        Path(sys.argv[sys.argv.index("--record") + 1]).write_text(
            json.dumps(capture(srv), ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )
