"""Judge outages stop runs: the circuit breaker, hanging endpoints, error texts that say what happened.

Real components only: the fake OpenAI HTTP server (its hang mode accepts connections and never answers), a port
nothing listens on, Prefect flows run for real.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.errors import JudgeTransientError, RunFailed
from recall_tasks.fleet.guards import NOT_JUDGED, CircuitBreaker
from recall_tasks.judges._openai_attempts import begin_attempt, counted_attempts, reported_attempt
from recall_tasks.judges.base import JudgeRequest, JudgeResponse, attempt_observer, spend_of
from recall_tasks.judges.claims import ClaimsReply
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.metrics.claims import NotJudged
from recall_tasks.metrics.recall import ContextualRecall
from recall_tasks.pipeline.flow import recall_benchmark
from recall_tasks.pipeline.results_table import RowOutcome
from recall_tasks.pipeline.scoring import _guard, score_rows
from tests import judge_script
from tests.fake_openai import Content, Delay, Reset, Status
from tests.s3_server import closed_port
from tests.test_pipeline import KEY, make_rows, write_parquet


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def run(base_url: str, data: str, out: Path, **kw):
    kw.setdefault("chunk_size", 10)
    return recall_benchmark(RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=base_url, **kw))


def failed_run(base_url: str, data: str, out: Path, **kw):
    """A run the breaker stops: committed with status failed, then the flow raises RunFailed with its summary."""
    with pytest.raises(RunFailed) as info:
        run(base_url, data, out, **kw)
    return info.value.summary


def results(out: Path) -> list[dict]:
    return DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()


def test_hanging_endpoint_costs_about_one_timeout_for_the_whole_run(prefect_harness, judge_env, tmp_path):
    """Accepts, never answers: without the breaker 30 rows at 8 in flight wait ~4 x 5 attempts x 1 s (+ backoff)."""
    data = write_parquet(tmp_path / "eval.parquet", make_rows(30, seed=61))
    out = tmp_path / "out"
    judge_env.hang = True
    summary = failed_run(judge_env.base_url, data, out, timeout_s=1.0, max_retries=4, max_concurrency=8)
    assert summary["wall_seconds"] < 9, summary["wall_seconds"]  # one row alone: 5 x 1 s + 7.5 s of backoff
    assert summary["status"] == "failed" and summary["scored"] == 0
    reason = summary["status_reason"]
    assert f"judge endpoint 127.0.0.1:{judge_env.port} failed" in reason and "no answer within 1 s" in reason
    assert len(judge_env.chat_requests) <= 12  # the calls in flight when it tripped, hardly any retry
    rows = results(out)
    assert len(rows) == 30 and all(r["score"] is None for r in rows)
    not_judged = [r for r in rows if r["reason"] and r["reason"].startswith("not judged: judge endpoint 127.0.0.1")]
    assert len(not_judged) == summary["not_judged"] >= 22 and summary["skipped"] == 0
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert runs[0]["status"] == "failed" and runs[0]["status_reason"] == reason


def test_failing_endpoint_trips_after_ten_failed_attempts(prefect_harness, judge_env, tmp_path):
    data = write_parquet(tmp_path / "eval.parquet", make_rows(40, seed=63))
    out = tmp_path / "out"
    judge_env.enqueue(*[Status(503)] * 60)
    summary = failed_run(judge_env.base_url, data, out, max_retries=0, max_concurrency=2, max_workers=1)
    assert summary["status"] == "failed"
    assert "failed 10 attempts in a row (last: HTTP 503)" in summary["status_reason"]
    assert 10 <= len(judge_env.chat_requests) <= 12
    assert summary["scored"] == 0 and summary["errors"] + summary["not_judged"] == 40 and summary["not_judged"] >= 28
    assert summary["requests"] == len(judge_env.chat_requests)  # the attempts of failed rows count
    # many calls waiting for their turn when it trips: they are not judged and made no request
    judge_env.reset()
    judge_env.enqueue(*[Status(503)] * 200)
    wide = failed_run(judge_env.base_url, data, tmp_path / "out-wide", max_retries=0, max_concurrency=8, max_workers=1)
    assert wide["status"] == "failed" and wide["requests"] == len(judge_env.chat_requests) < 40


def test_flaky_but_answering_endpoint_does_not_trip(prefect_harness, judge_env, tmp_path):
    """Failures with answers in between reset the count: 9 failures, an answer, 9 more."""
    data = write_parquet(tmp_path / "eval.parquet", make_rows(30, seed=65))
    answer = Content('{"verdicts": [{"id": 1, "verdict": "yes", "reason": "", "chunk_ids": [1]}], "summary": ""}')
    judge_env.enqueue(*[Status(500)] * 9, answer, *[Status(500)] * 9)
    summary = run(
        judge_env.base_url, data, tmp_path / "out", max_retries=0, max_concurrency=1, max_workers=1, max_error_rate=1
    )
    assert summary["status"] == "completed" and summary["status_reason"] is None
    assert summary["scored"] + summary["errors"] == 30 and summary["errors"] == 18


def test_requests_count_the_retries_of_rows_that_failed(prefect_harness, judge_env, tmp_path):
    data = write_parquet(tmp_path / "eval.parquet", make_rows(3, seed=67))
    out = tmp_path / "out"
    judge_env.enqueue(*[Status(503)] * 9)  # 3 rows x 3 attempts: below the breaker's 10
    summary = run(judge_env.base_url, data, out, max_retries=2, max_concurrency=1, max_error_rate=1)
    assert summary["errors"] == 3 and summary["status"] == "completed"
    assert summary["requests"] == 9 == len(judge_env.chat_requests)
    assert [r["requests"] for r in results(out)] == [3, 3, 3]


def test_cli_timeout_and_retries_options_and_exit_4_on_an_outage(prefect_harness, judge_env, tmp_path):
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = write_parquet(tmp_path / "eval.parquet", make_rows(30, seed=69))
    port = judge_env.port
    judge_env.enqueue(*[Reset()] * 100)  # up for the pre-flight probe, then every chat request is reset
    args = ["run", data, "--output", str(tmp_path / "out"), "--judge", "openai", "--base-url",
            judge_env.base_url, "--timeout-s", "2.5", "--max-retries", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 4, result.output
    assert "Traceback" not in result.output
    assert re.search(
        rf"^run \S+ failed: judge endpoint 127\.0\.0\.1:{port} failed 10 attempts in a row "
        r"\(last: connection reset by the server\); judging stopped, the remaining rows were not judged",
        result.output,
        re.M,
    ), result.output
    errors = [r["error"] for r in results(tmp_path / "out") if r["error"]]
    assert all(e == f"JudgeTransientError: cannot connect to 127.0.0.1:{port}: connection reset by the server "
               "(1 retries)" for e in errors), errors  # fmt: skip
    help_text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "--timeout-s" in help_text and "--max-retries" in help_text


# -- what a failed judge call says ------------------------------------------------------------------------------


REQUEST = JudgeRequest(task="contextual_recall", question="q", statements=["Alpha bravo."], evidence=["alpha bravo"])


async def _judge_error(base_url: str, **kw) -> JudgeTransientError:
    judge = OpenAIJudge(base_url=base_url, api_key=KEY, **kw)
    try:
        with pytest.raises(JudgeTransientError) as info:
            await judge.judge(REQUEST)
    finally:
        await judge.aclose()
    return info.value


@pytest.mark.parametrize(
    ("where", "fault", "expected"),
    [
        ("refused", None, r"cannot connect to 127\.0\.0\.1:\d+: connection refused \(1 retries\)"),
        ("dns", None, r"cannot connect to no-such-host\.invalid: DNS lookup failed \(name not resolved\)"),
        ("tls", None, r"cannot connect to 127\.0\.0\.1:\d+: TLS error \(WRONG_VERSION_NUMBER\) \(1 retries\)"),
        ("fake", Reset(), r"cannot connect to 127\.0\.0\.1:\d+: connection reset by the server \(1 retries\)"),
        ("fake", Delay(2.0), r"^127\.0\.0\.1:\d+: no answer within 0\.4 s \(1 retries\)$"),
        ("fake", Status(503), r"^127\.0\.0\.1:\d+ failed with 503 after 1 retries"),
    ],
    ids=["refused", "dns", "tls", "reset", "timeout", "503"],
)
def test_judge_errors_say_what_happened(fake_openai, where, fault, expected):
    url = {
        "refused": f"http://127.0.0.1:{closed_port()}/v1",
        "dns": "http://no-such-host.invalid/v1",
        "tls": fake_openai.base_url.replace("http://", "https://"),
        "fake": fake_openai.base_url,
    }[where]
    if fault is not None:
        fake_openai.enqueue(fault, fault)
    error = asyncio.run(_judge_error(url, max_retries=1, timeout_s=0.4))
    assert re.search(expected, str(error)), str(error)
    assert "did not answer" not in str(error) and KEY not in str(error)
    assert error.requests == 2  # both attempts are known to the caller


def test_breaker_counts_attempts_and_resets_on_an_answer():
    breaker = CircuitBreaker(threshold=3, timeout_threshold=2)
    breaker.attempt_failed("h:1", "HTTP 503")
    breaker.attempt_failed("h:1", "HTTP 503")
    breaker.attempt_ok()
    breaker.attempt_failed("h:1", "connection refused")
    breaker.attempt_failed("h:1", "connection refused")
    assert breaker.tripped_reason is None
    breaker.attempt_failed("h:1", "connection refused")
    assert breaker.tripped_reason == (
        "judge endpoint h:1 failed 3 attempts in a row (last: connection refused); judging stopped, the remaining "
        "rows were not judged"
    )
    timeouts = CircuitBreaker(threshold=10, timeout_threshold=2)
    timeouts.attempt_failed("h:1", "no answer within 60 s", timed_out=True)
    timeouts.attempt_failed("h:1", "no answer within 60 s", timed_out=True)
    assert timeouts.tripped_reason is not None and "no answer within 60 s" in timeouts.tripped_reason


class _InFlightJudge:
    """A judge whose one HTTP attempt goes out (counted and reported as sent, as the OpenAI judge's) and is never
    answered: it is in flight when the breaker trips."""

    model = "in-flight"
    prompt_version = "v1"

    def __init__(self) -> None:
        self.sent = asyncio.Event()

    def config(self) -> dict[str, str]:
        return {"judge": self.model}

    async def attempt(self) -> None:
        with counted_attempts():
            await begin_attempt(chat=True)
            with reported_attempt("h:1", 60.0):
                self.sent.set()
                await asyncio.Event().wait()  # the endpoint has the request and has not answered

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        await self.attempt()
        raise AssertionError("never answered")

    async def extract_claims(self) -> ClaimsReply:
        await self.attempt()
        raise AssertionError("never answered")


def test_a_call_cancelled_by_the_breaker_counts_its_attempt_in_flight():
    """An attempt sent and not answered when the breaker trips (another call's failure) reached the endpoint: the
    row cancelled counts it (it counted only the attempts answered or failed: one POST fewer than the server had)."""
    row = {"input": "", "expected_output": "Bees make honey.", "retrieval_context": ["Bees make honey daily."]}

    async def judged() -> RowOutcome:
        breaker, judge = CircuitBreaker(), _InFlightJudge()
        scoring = asyncio.create_task(score_rows(ContextualRecall(judge=judge), [row], breaker=breaker))
        await judge.sent.wait()
        breaker.trip("down")
        return (await scoring)[0]

    out = asyncio.run(judged())
    assert out.result is not None and out.result.metadata.flags == [NOT_JUDGED + "down"]
    assert out.requests == 1

    async def extracted() -> BaseException:
        breaker, judge = CircuitBreaker(), _InFlightJudge()
        token = attempt_observer.set(breaker)  # as score_rows sets it around the claim extractions
        try:
            extraction = asyncio.create_task(_guard(None, breaker)(judge.extract_claims))
        finally:
            attempt_observer.reset(token)
        await judge.sent.wait()
        breaker.trip("down")
        with pytest.raises(NotJudged) as stopped:
            await extraction
        return stopped.value

    assert spend_of(asyncio.run(extracted())).requests == 1
