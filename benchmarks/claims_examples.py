"""The three seed examples in both unit modes, and the requests per row of three nights in claims mode.

    python -m benchmarks.claims_examples

Deterministic and offline: the real ``OpenAIJudge`` (extraction and attribution) against the tests' fake OpenAI
server, whose extractor answers the claims written below (what an LLM would list) and whose judge is
``tests/judge_script.py``'s rule (a unit is supported when every word of 4+ letters is in ONE chunk). Rows go
through ``pipeline.scoring.score_rows`` with the output's row cache and claims cache in a temporary folder, as
in a run (the chunk cache and the tables are left out: they change nothing here).
"""

from __future__ import annotations

import tempfile
from typing import Any

from recall_tasks import ContextualRecall
from recall_tasks._sync import run_sync
from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.pipeline.scoring import score_rows
from tests import judge_script
from tests.fake_openai import FakeOpenAI

EXAMPLES: list[dict[str, Any]] = [
    {
        "name": "Einstein",
        "input": "Who was Albert Einstein?",
        "expected_output": "Einstein was born in 1879 and developed relativity.",
        "retrieval_context": ["Albert Einstein was born in Ulm in 1879.", "Ulm is a city on the Danube."],
        "claims": ["Einstein was born in 1879.", "Einstein developed relativity."],
    },
    {
        "name": "Paris",
        "input": "Tell me about Paris.",
        "expected_output": "Paris is the capital of France and is its largest city. The Eiffel Tower is in Paris.",
        "retrieval_context": ["Paris is the capital of France.", "The Eiffel Tower is in Paris."],
        "claims": ["Paris is the capital of France.", "Paris is the largest city of France.",
                   "The Eiffel Tower is in Paris."],
    },
    {
        "name": "security measures",
        "input": "Which security measures protect the platform?",
        "expected_output": "Security measures include encryption of stored data and multi-factor authentication "
        "for administrators. All access is logged.",
        "retrieval_context": ["Security measures include encryption of stored data at rest.",
                              "Security measures include multi-factor authentication for administrators."],
        "claims": ["Security measures include encryption of stored data.",
                   "Security measures include multi-factor authentication for administrators.",
                   "All access is logged."],
    },
]  # fmt: skip

CLAIMS = {e["expected_output"]: e["claims"] for e in EXAMPLES}


def rows(contexts_prefix: list[str] | None = None) -> list[dict[str, Any]]:
    extra = contexts_prefix or []
    return [
        {"input": e["input"], "expected_output": e["expected_output"],
         "retrieval_context": [*extra, *e["retrieval_context"]], "actual_output": None}
        for e in EXAMPLES
    ]  # fmt: skip


def night(srv: FakeOpenAI, folder: str, units: str, batch: list[dict[str, Any]]) -> tuple[list[Any], int, int]:
    """One run over ``batch`` in a fresh process's objects; returns outcomes, extraction and judge requests."""
    srv.requests.clear()
    judge = OpenAIJudge(base_url=srv.base_url, api_key="sk-fake")
    metric = ContextualRecall(judge=judge, units=units)  # type: ignore[arg-type]
    cache = RowVerdictCache(f"{folder}/cache", StorageConfig())
    if metric.claim_units is not None:
        metric.claim_units.store = cache.claims
    try:
        outcomes = run_sync(score_rows(metric, batch, cache))
    finally:
        cache.close()
        run_sync(judge.aclose())
    bodies = [r["body"] for r in srv.chat_requests]
    extractions = sum(judge_script.is_extraction(b) for b in bodies)
    return outcomes, extractions, len(bodies) - extractions


def main() -> None:
    srv = FakeOpenAI(responder=judge_script.claims_responder(lambda ref, retry: CLAIMS[ref])).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print("The seed examples in both unit modes (fake extractor and judge, see the module docstring)\n")
            for units in ("sentences", "claims"):
                outcomes, _, _ = night(srv, f"{tmp}/{units}-demo", units, rows())
                for example, out in zip(EXAMPLES, outcomes, strict=True):
                    result = out.result
                    assert result is not None and result.score is not None, out.error
                    print(f"{example['name']} / {units}: score {result.score:.2f}")
                    for k, v in enumerate(result.verdicts, 1):
                        print(f"  {k}. [{v.verdict:>3}] {v.statement}")
                print()
            print("Requests per row in claims mode (3 rows, 3 distinct references), one output folder:")
            folder = f"{tmp}/nightly"
            plan = [
                ("night 1 (cold caches)", rows()),
                ("night 2 (index rebuilt: new contexts)", rows(["A chunk the new index added."])),
                ("night 3 (nothing changed)", rows(["A chunk the new index added."])),
            ]
            for label, batch in plan:
                outcomes, extractions, judged = night(srv, folder, "claims", batch)
                per_row = (extractions + judged) / len(batch)
                cached = sum(o.cached for o in outcomes)
                print(
                    f"  {label}: {extractions} extraction + {judged} judge requests = {per_row:.2f} per row"
                    f" ({cached} rows from the row cache)"
                )
            outcomes, extractions, judged = night(srv, f"{tmp}/sentences", "sentences", rows())
            print(f"  sentence mode, cold: {(extractions + judged) / len(outcomes):.2f} per row")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
