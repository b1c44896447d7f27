"""``--tpm`` charges each request in full: ~3,000-token prompts against a server enforcing a token quota.

The fake OpenAI server counts prompt tokens over a sliding minute (``tpm_quota``, 429 beyond it) and every client
runs with ``--max-retries 0``, so a request over the quota is a row error, never hidden by a retry. Each side sends
more than one minute's quota in all, so the limiter must spread the requests over more than a minute: before, it
capped a request's charge at one second's worth of the quota and let ten such requests through in about 10 s.

One test, both cases at once (a minute is the test's length, so they share it): a judge alone (``--tpm`` per
process) against one server, and two judges sharing the fleet limit in Prefect against another.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from recall_tasks.config import RunParams
from recall_tasks.fleet import rate as fleet
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.judges.ratelimit import RateLimiter
from tests import judge_script
from tests.fake_openai import FakeOpenAI
from tests.test_pipeline import KEY

#: ~12,000 characters of evidence: with the prompt around it, ~3,250 prompt tokens per request
FILLER = " ".join(f"filler sentence number {i} adds nothing to the answer." for i in range(220))


def test_a_request_larger_than_the_bucket_waits_for_its_share():
    """Two requests of twice the bucket (one second's worth): 3 s in all, not the 1 s a capped charge took."""

    async def go() -> float:
        limiter = RateLimiter(60_000)  # 1,000 units/s, a bucket of 1,000
        t0 = time.monotonic()
        await limiter.acquire(2_000)
        await limiter.acquire(2_000)
        return time.monotonic() - t0

    assert asyncio.run(go()) >= 2.9


def _send(server: FakeOpenAI, tpm: int, n: int, params: RunParams | None = None) -> list[str]:
    """``n`` requests of ~3,250 prompt tokens through one judge with ``--tpm`` (shared fleet-wide through Prefect
    with ``params``), on an event loop of its own; the errors (none expected)."""

    async def go() -> list[str]:
        judge = OpenAIJudge(base_url=server.base_url, api_key=KEY, tokens_per_minute=tpm, max_retries=0)
        if params is not None:
            assert fleet.share_limits(params, judge)  # the limit in Prefect, as every worker process takes it
        requests = [
            JudgeRequest(
                task="contextual_recall",
                question=f"What about item {i}?",
                statements=["Alpha beta gamma."],
                evidence=["alpha beta gamma with context", FILLER],
            )  # fmt: skip
            for i in range(n)
        ]
        try:
            out = await asyncio.gather(*(judge.judge(r) for r in requests), return_exceptions=True)
        finally:
            await judge.aclose()
        return [repr(o) for o in out if isinstance(o, BaseException)]

    return asyncio.run(go())


@pytest.mark.concurrency
def test_3000_token_prompts_keep_every_minute_within_the_token_quota_locally_and_fleet_wide(prefect_harness, tmp_path):
    """Alone: 10 requests at --tpm 30000. Fleet: two judges on loops of their own (as two worker processes), 10
    requests each, sharing --tpm 60000 through the Prefect limit. Both send more than a minute's quota in all."""
    local_tpm, fleet_tpm, n = 30_000, 60_000, 10
    params = RunParams(dataset_uri=str(tmp_path), tokens_per_minute=fleet_tpm, rate_limit_key=f"tq-{tmp_path.name}")
    with (
        FakeOpenAI(judge_script.responder, tpm_quota=local_tpm) as alone,
        FakeOpenAI(judge_script.responder, tpm_quota=fleet_tpm) as shared,
        ThreadPoolExecutor(3) as pool,
    ):
        local = pool.submit(_send, alone, local_tpm, n)
        workers = [pool.submit(_send, shared, fleet_tpm, n, params) for _ in range(2)]
        assert (local.result(), [w.result() for w in workers]) == ([], [[], []])  # no 429: no row error

    assert alone.tpm_429s == 0 and len(alone.tpm_accepted) == n
    assert sum(tokens for _, tokens in alone.tpm_accepted) > local_tpm  # more than a minute's quota in all
    assert alone.busiest_tokens() <= local_tpm
    assert shared.tpm_429s == 0 and len(shared.tpm_accepted) == 2 * n
    assert sum(tokens for _, tokens in shared.tpm_accepted) > fleet_tpm
    assert shared.busiest_tokens() <= fleet_tpm


@pytest.mark.concurrency
def test_the_fake_server_refuses_prompt_tokens_over_its_sliding_minute():
    import openai

    with FakeOpenAI(judge_script.responder, tpm_quota=5_000) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
        ask = [{"role": "user", "content": "x" * 12_000}]  # 3,000 prompt tokens
        client.chat.completions.create(model="gpt-4o-mini", messages=ask)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="gpt-4o-mini", messages=ask)  # type: ignore[arg-type]
        client.close()
    assert 59 < float(refused.value.response.headers["retry-after"]) <= 60
    assert server.tpm_429s == 1 and [n for _, n in server.tpm_accepted] == [3_000] and server.busiest_tokens() == 3_000
