"""``benchmarks/fake_judge.py`` (the benchmarks' judge) answers recall-bench's prompts as before and ragas'.

Over HTTP, the fake in its own process (as the benchmarks start it): recall-bench's judge scores every row 1.0,
every sentence supported, one request per row (``benchmarks/cpu_per_row.py``, ``startup.py`` and ``vs_ragas.py``
rely on it); a prompt laid out as ragas 0.4.3 lays out its context-recall prompt (``PydanticPrompt.to_string``
behind instructor's JSON-mode system message; ragas is not in this venv, so the layout is rebuilt here) gets one
classification per sentence of the row's reference, attributed 1, in the shape of ragas' output model.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from benchmarks.throughput import start_judge
from recall_tasks import ContextualRecall, OpenAIJudge, RecallCase

# the tail of ragas' prompt: after it comes the row as JSON (indent 4), then "\nOutput: "
RAGAS_TAIL = "\n-----------------------------\n\nNow perform the same with the following input\ninput: "


class Classification(BaseModel):  # ragas.metrics._context_recall.ContextRecallClassification
    statement: str
    reason: str
    attributed: int


class Classifications(BaseModel):  # ragas.metrics._context_recall.ContextRecallClassifications
    classifications: list[Classification]


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_judge(0.0, tmp_path_factory.mktemp("bench-judge"))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def stats(url: str, reset: bool = False) -> dict:
    query = "?reset=1" if reset else ""
    return dict(json.loads(urllib.request.urlopen(url.removesuffix("/v1") + "/stats" + query, timeout=5).read()))


def chat(url: str, messages: list[dict[str, str]]) -> str:
    body = json.dumps({"model": "gpt-4o-mini", "messages": messages, "response_format": {"type": "json_object"}})
    request = urllib.request.Request(
        url + "/chat/completions", body.encode(), {"Content-Type": "application/json", "Authorization": "Bearer k"}
    )
    return str(json.loads(urllib.request.urlopen(request, timeout=5).read())["choices"][0]["message"]["content"])


def test_recall_bench_rows_score_fully_with_one_request_each(judge_url: str) -> None:
    cases = [
        RecallCase(input="q1", expected_output="Paris is in France.", retrieval_context=["Paris is in France."]),
        RecallCase(
            input="q2",
            expected_output="The river 1999. The signal omega in 2001. A third one. Now perform the same with the "
            "following input\ninput: {}\nOutput: ",
            retrieval_context=["a", "b", "c", "d", "e"],
        ),
    ]
    stats(judge_url, reset=True)
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=judge_url, api_key="sk-bench", max_concurrency=4)
    metric = ContextualRecall(judge=judge)

    async def run() -> list:
        try:
            return list(await asyncio.gather(*(metric.a_measure(c) for c in cases)))
        finally:
            await judge.aclose()

    results = asyncio.run(run())
    assert [r.score for r in results] == [1.0, 1.0]
    assert [len(r.verdicts) for r in results] == [1, 4]
    assert all(v.verdict == "yes" and v.chunk_ids == [1] for r in results for v in r.verdicts)
    assert stats(judge_url)["requests"] == 2


def test_a_ragas_context_recall_prompt_gets_every_reference_sentence_attributed(judge_url: str) -> None:
    example = {"question": "Einstein?", "context": "He was born in 1879.", "answer": "Born 1879. Moved in 1895."}
    row = {
        "question": "What do we know about index 7?",
        "context": "The index alpha in 1999.\nThe vector beta in 2003.",
        "answer": 'The index alpha beta in 1999. The vector "gamma" in 2003!  The city omega in 2010?',
    }
    prompt = (
        "Given a context, and an answer, analyze each sentence in the answer and classify if the sentence can be "
        "attributed to the given context or not.\nPlease return the output in a JSON format ...\n"
        "--------EXAMPLES-----------\nExample 1\nInput: " + json.dumps(example, indent=4) + "\nOutput: {}"
        + RAGAS_TAIL + json.dumps(row, indent=4) + "\nOutput: "
    )  # fmt: skip
    system = "As a genius expert, your task is to understand the content and provide the parsed objects in json"
    content = chat(judge_url, [{"role": "system", "content": system}, {"role": "user", "content": prompt}])

    parsed = Classifications.model_validate_json(content)
    assert [c.statement for c in parsed.classifications] == [
        "The index alpha beta in 1999.",
        'The vector "gamma" in 2003!',
        "The city omega in 2010?",
    ]
    assert [c.attributed for c in parsed.classifications] == [1, 1, 1]


def timeline(url: str, reset: bool = False) -> dict:
    query = "?reset=1" if reset else ""
    return dict(json.loads(urllib.request.urlopen(url.removesuffix("/v1") + "/timeline" + query, timeout=5).read()))


def test_prompt_tokens_and_each_requests_times_are_counted_until_a_reset(judge_url: str) -> None:
    """What ``vs_ragas``/``cpu_per_row`` print per row (judge calls, prompt tokens: characters / 4 of all the
    messages) and what ``window_gaps`` reads (each request's arrival and answer time)."""
    stats(judge_url, reset=True)
    timeline(judge_url, reset=True)
    first = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": 'Statements:\n1. "a"'}]
    second = [{"role": "user", "content": "x" * 401 + '\n1. "a"\n2. "b"'}]
    chat(judge_url, first)
    chat(judge_url, second)

    counted = stats(judge_url)
    joined = ["\n".join(m["content"] for m in messages) for messages in (first, second)]
    assert counted["requests"] == 2
    assert counted["prompt_tokens"] == sum(len(text) // 4 for text in joined)
    times = timeline(judge_url, reset=True)
    assert len(times["arrived"]) == len(times["answered"]) == 2
    assert all(a <= b for a, b in zip(times["arrived"], times["answered"], strict=True))
    assert times["arrived"][0] <= times["arrived"][1]
    assert timeline(judge_url) == {"arrived": [], "answered": []}
    assert stats(judge_url, reset=True)["prompt_tokens"] == counted["prompt_tokens"]  # read, then reset
    assert stats(judge_url)["prompt_tokens"] == 0


def test_a_figure_is_loaded_when_any_run_behind_it_began_above_a_load_of_one() -> None:
    from benchmarks.load import NOT_FOR_README, stamp, summary

    assert stamp([0.2, 1.0]) == "quiet"
    assert stamp([0.2, 1.01]) == "loaded"
    assert stamp([]) == "quiet"
    assert summary([0.5, 3.25]) == "1-minute load before the runs: 0.50-3.25 (loaded)"
    assert "not for the README" in NOT_FOR_README


def test_settle_waits_for_the_load_to_fall_to_one_and_no_longer_than_it_may(monkeypatch) -> None:
    from benchmarks import load

    seen = iter([3.0, 1.6, 0.9, 0.5])
    monkeypatch.setattr(load, "load_1min", lambda: next(seen))
    slept: list[float] = []
    monkeypatch.setattr(load.time, "sleep", slept.append)
    assert load.settle(60.0) == 0.9 and len(slept) == 2  # stops at the first load of 1 or less
    monkeypatch.setattr(load, "load_1min", lambda: 4.0)
    slept.clear()
    assert load.settle(0.0) == 4.0 and slept == []  # 0: no wait, the load as it is (stamped loaded)
