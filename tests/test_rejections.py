"""One row the endpoint rejects never sinks the run; a rejection every request meets stops it, saying which.

And the context window: a request over it is counted before sending and refused (default), cut or sent.
Real components: the fake OpenAI server rejects as OpenAI does (``context_window``: 400 context_length_exceeded)
and as a proxy does (``max_body_bytes``: an nginx 413 page); runs are real Prefect flows and CLI processes.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from recall_tasks.config import RunParams
from recall_tasks.errors import ContextOverflowError
from recall_tasks.fleet.guards import CircuitBreaker
from recall_tasks.judges import context_window, tokens
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.fake_openai import error_body, extract_user_text
from tests.test_caching import ROOT, cli_env
from tests.test_pipeline import KEY, make_rows, write_parquet
from tests.test_sentences import OTHER_THREADS_RANDOM, PROPERTY

LONG = "lorem ipsum dolor sit amet " * 600  # ~16 KB: ~4000 tokens by the fake's count
LONG_ROWS = ("r0005", "r0017")


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def dataset(tmp_path: Path, n: int = 30, long_rows: tuple[str, ...] = LONG_ROWS) -> str:
    rows = make_rows(n, seed=71)
    for row in rows:
        if row["row_id"] in long_rows:
            row["contexts"] = [*row["contexts"], LONG]
    return write_parquet(tmp_path / "eval.parquet", rows)


def results(out: Path) -> dict[str, dict]:
    return {r["row_id"]: r for r in DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()}


def runs(out: Path) -> list[dict]:
    return DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()


def run(judge, data: str, out: Path, **kw):
    kw.setdefault("chunk_size", 10)
    return recall_benchmark(
        RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge.base_url, **kw)
    )


def run_cli(judge, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recall_tasks", "run", *args, "--judge", "openai", "--base-url", judge.base_url],
        env=cli_env(judge), cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def sent_long(judge) -> int:
    return sum(1 for r in judge.chat_requests if "lorem ipsum" in extract_user_text(r["body"]))


# -- one row rejected: that row's error --------------------------------------------------------------------------


@pytest.mark.concurrency
def test_a_row_over_the_endpoints_window_is_that_rows_error_and_the_run_commits(prefect_harness, judge_env, tmp_path):
    """Today's failure: the first 400 context_length_exceeded cancelled the run (exit 2, no runs row, the row not
    named) after the other rows were paid. Now the two rows are errors naming the rejection, the rest is scored and
    committed, exit 0 (2 of 30 is under --max-error-rate 0.1)."""
    data = dataset(tmp_path)
    out = tmp_path / "out"
    judge_env.context_window = 2000  # the endpoint's; the judge knows gpt-4o-mini's 128k: it sends them
    done = run_cli(judge_env, data, "--output", str(out), "--max-error-rate", "0.1", "--chunk-size", "10")
    assert done.returncode == 0, done.stdout + done.stderr
    port = judge_env.port
    line = next(x for x in done.stderr.splitlines() if "ended with an error" in x)
    assert re.fullmatch(
        rf"2 row\(s\) ended with an error; most common \(1 rows\): JudgeRejectedError: 127\.0\.0\.1:{port} rejected "
        r"the request \(400\): This model's maximum context length is 2000 tokens\. However, you requested \d+ "
        r"tokens .*; context_length_exceeded; messages",
        line,
    ), line
    rows = results(out)
    assert len(rows) == 30
    for row_id, row in rows.items():
        if row_id in LONG_ROWS:
            assert row["score"] is None and "(400)" in row["error"] and "context_length_exceeded" in row["error"]
            assert row["requests"] == 1  # a rejection is not retried
        else:
            assert row["error"] is None and row["score"] is not None, row
    (overall,) = runs(out)
    assert overall["status"] == "completed" and overall["errors"] == 2
    assert overall["requests"] == len(judge_env.chat_requests) == 30


def test_a_proxys_413_is_that_rows_error(prefect_harness, judge_env, tmp_path):
    data = dataset(tmp_path)
    out = tmp_path / "out"
    judge_env.max_body_bytes = 8000  # the long rows' bodies are ~17 KB
    summary = run(judge_env, data, out, max_error_rate=0.1)
    assert summary["status"] == "completed" and summary["errors"] == 2 and summary["scored"] == 28
    rows = results(out)
    for row_id in LONG_ROWS:
        assert rows[row_id]["error"] == (
            f"JudgeRejectedError: 127.0.0.1:{judge_env.port} rejected the request (413): 413 Request Entity Too Large"
        )


@pytest.mark.concurrency
def test_rejections_of_every_request_stop_the_run_with_exit_4_and_commit(prefect_harness, judge_env, tmp_path):
    """A bad parameter (an endpoint that refuses temperature 0 for this model) meets every request: the breaker
    stops the run after 10 rejections in a row; the rows judged so far and the reason are committed, exit 4."""
    data = dataset(tmp_path, n=60, long_rows=())
    out = tmp_path / "out"
    message = "Unsupported value: 'temperature' does not support 0 with this model."
    refusal = error_body(400, message=message, param="temperature", code="unsupported_value")
    judge_env.set_responder(lambda body: {"status": 400, "json": refusal})
    done = run_cli(judge_env, data, "--output", str(out), "--max-concurrency", "2", "--chunk-size", "10",
                   "--max-workers", "1")  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert re.search(
        r"^run \S+ failed: the judge endpoint rejected 10 requests in a row and accepted none \(last: "
        rf"127\.0\.0\.1:{judge_env.port} rejected the request \(400\): Unsupported value: 'temperature'",
        done.stderr,
        re.M,
    ), done.stderr
    rows = results(out)
    assert len(rows) == 60
    (overall,) = runs(out)
    assert overall["status"] == "failed" and "accepted none" in overall["status_reason"]
    assert 10 <= overall["requests"] == len(judge_env.chat_requests) <= 12  # the calls in flight when it tripped
    assert sum(1 for r in rows.values() if r["reason"] and r["reason"].startswith("not judged: ")) >= 48


def test_the_breaker_counts_rejections_in_a_row_only():
    breaker = CircuitBreaker()
    for _ in range(9):
        breaker.request_rejected("h:1 rejected the request (400): too long")
    breaker.request_answered()
    for _ in range(9):
        breaker.request_rejected("h:1 rejected the request (400): too long")
    assert breaker.tripped_reason is None
    breaker.request_rejected("h:1 rejected the request (413): 413 Request Entity Too Large")
    assert breaker.tripped_reason == (
        "the judge endpoint rejected 10 requests in a row and accepted none (last: h:1 rejected the request (413): "
        "413 Request Entity Too Large): a rejection every request meets (check --model and the endpoint's "
        "parameters); judging stopped, the remaining rows were not judged"
    )


# -- the context window, counted before sending -------------------------------------------------------------------


def test_over_the_window_is_refused_before_sending_by_default(prefect_harness, judge_env, tmp_path):
    data = dataset(tmp_path)
    out = tmp_path / "out"
    summary = run(judge_env, data, out, context_window=3000, max_error_rate=0.1)
    assert summary["status"] == "completed" and summary["errors"] == 2
    assert sent_long(judge_env) == 0 and len(judge_env.chat_requests) == 28  # no request for them
    rows = results(out)
    for row_id in LONG_ROWS:
        error = rows[row_id]["error"]
        assert re.fullmatch(
            r"ContextOverflowError: the prompt and its reply budget need about \d+ tokens, over gpt-4o-mini's context "
            r"window of 3000: not sent \(--on-overlong refuse; --on-overlong truncate cuts the context to fit, "
            r"--context-window N sets the window\)",
            error,
        ), error
        assert rows[row_id]["requests"] == 0 and rows[row_id]["cost_usd"] in (0.0, None)
    assert summary["requests"] == 28


def test_truncate_cuts_the_context_to_fit_and_says_so(prefect_harness, judge_env, tmp_path):
    data = dataset(tmp_path)
    out = tmp_path / "out"
    summary = run(judge_env, data, out, context_window=3000, on_overlong="truncate")
    assert summary["status"] == "completed" and summary["errors"] == 0 and summary["scored"] == 30
    rows = results(out)
    for row_id in LONG_ROWS:
        (flag,) = [f for f in rows[row_id]["flags"] if f.startswith("context cut")]
        kept, before = map(int, re.fullmatch(
            r"context cut to fit gpt-4o-mini's context window of 3000 tokens \(--on-overlong truncate\): about "
            r"(\d+) of (\d+) context tokens kept", flag).groups())  # fmt: skip
        assert 1000 < kept < before
    judge = OpenAIJudge(api_key=KEY, base_url=judge_env.base_url)
    long_bodies = [r["body"] for r in judge_env.chat_requests if "lorem ipsum" in extract_user_text(r["body"])]
    assert len(long_bodies) == 2
    for body in long_bodies:
        schema = body["response_format"]["json_schema"]["schema"]
        needed = context_window.tokens_needed(body["messages"], body["max_tokens"], schema)
        assert 2900 < needed <= 3000  # cut to fit, not far below
        assert "[cut]" in extract_user_text(body) and judge.model == body["model"]


def test_send_leaves_it_to_the_endpoint(prefect_harness, judge_env, tmp_path):
    data = dataset(tmp_path)
    judge_env.context_window = 2000
    summary = run(judge_env, data, tmp_path / "out", context_window=3000, on_overlong="send", max_error_rate=0.1)
    assert summary["errors"] == 2 and sent_long(judge_env) == 2
    assert all("context_length_exceeded" in results(tmp_path / "out")[r]["error"] for r in LONG_ROWS)


REQUEST = JudgeRequest(task="contextual_recall", question="What is alpha?", statements=["Alpha is bravo."],
                       evidence=["alpha is bravo"])  # fmt: skip


def at_the_window(judge: OpenAIJudge, window: int) -> JudgeRequest:
    """A request whose context brings it to exactly ``window`` tokens by the judge's count."""
    words = []
    while judge.tokens_needed(REQUEST.model_copy(update={"evidence": ["alpha is bravo", " ".join(words)]})) < window:
        words.append("ab")
    request = REQUEST.model_copy(update={"evidence": ["alpha is bravo", " ".join(words)]})
    assert judge.tokens_needed(request) == window
    return request


def test_a_context_exactly_at_the_window_is_sent_one_token_more_is_not(judge_env):
    async def attempt(window: int, request: JudgeRequest) -> None:
        judge = OpenAIJudge(api_key=KEY, base_url=judge_env.base_url, context_window_tokens=window)
        try:
            await judge.judge(request)
        finally:
            await judge.aclose()

    probe = OpenAIJudge(api_key=KEY, base_url=judge_env.base_url)
    request = at_the_window(probe, 1500)
    asyncio.run(attempt(1500, request))
    assert len(judge_env.chat_requests) == 1
    with pytest.raises(ContextOverflowError, match="need about 1500 tokens, over gpt-4o-mini's context window of 1499"):
        asyncio.run(attempt(1499, request))
    assert len(judge_env.chat_requests) == 1  # nothing sent


def test_known_windows_and_the_estimate():
    assert context_window.window_for("gpt-4o-mini") == 128_000
    assert context_window.window_for("gpt-4o-mini-2024-07-18") == 128_000  # a dated snapshot: its family's
    assert context_window.window_for("gpt-4") == 8_192 and context_window.window_for("gpt-4-0613") == 8_192
    assert context_window.window_for("llama-3-8b-instruct") is None  # unknown: not checked
    assert context_window.window_for("llama-3-8b-instruct", 8192) == 8192
    count = tokens.count  # the one estimate (tests/test_tokens.py): an upper bound, close for English
    assert count("") == 0 and count("hello world") == 2 and count("internationalization") >= 2
    assert count("2024") == 2 and count("東京都") >= 4 and count("🙂") == 4
    assert json.dumps(context_window.POLICIES) == '["refuse", "truncate", "send"]'


# -- the bound that spares the count ------------------------------------------------------------------------------

#: any text: every Unicode category, lone surrogates included (the count encodes with ``surrogatepass``)
_ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)


@OTHER_THREADS_RANDOM
@settings(max_examples=800, **PROPERTY)
@given(st.lists(_ANY_TEXT, min_size=1, max_size=3), st.integers(0, 4096), st.booleans())
def test_the_byte_bound_is_never_below_the_count(contents, budget, with_schema):
    msgs = [{"role": "user", "content": c} for c in contents]
    schema = {"type": "object", "properties": {"verdicts": {"type": "array"}}} if with_schema else None
    assert context_window.tokens_at_most(msgs, budget, schema) >= context_window.tokens_needed(msgs, budget, schema)


def test_a_request_whose_bytes_fit_is_not_counted_one_near_the_window_is():
    def uncounted(_: JudgeRequest) -> int:
        raise AssertionError("counted a request whose bytes fit the window")

    def bound(request: JudgeRequest) -> int:
        return judge.tokens_at_most(request)

    judge = OpenAIJudge(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    request = at_the_window(judge, 1500)
    at_most = judge.tokens_at_most(request)
    assert at_most > 1500  # "ab" words: 3 bytes and 1 token each, so the bound is far above the count here
    assert context_window.fit(request, uncounted, at_most, "refuse", "m", bound) == (request, None)
    for policy in context_window.POLICIES:  # over by its bytes, not by its count: counted, then sent as is
        assert context_window.fit(request, judge.tokens_needed, 1500, policy, "m", bound) == (request, None)
    with pytest.raises(ContextOverflowError, match="need about 1500 tokens"):
        context_window.fit(request, judge.tokens_needed, 1499, "refuse", "m", bound)
    assert context_window.fit(request, uncounted, 10, "send", "m", bound) == (request, None)  # send: never counted
