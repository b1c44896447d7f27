"""Tests of the fake OpenAI server itself, driven by the real ``openai`` SDK."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests import fake_openai as _fake
from tests.fake_openai import (
    DEFAULT_CONTENT,
    Content,
    Delay,
    FakeOpenAI,
    Reset,
    Status,
    extract_user_text,
)

# Register the fixtures for this module (the project's conftest may also import them).
fake_openai_server = _fake.fake_openai_server
fake_openai = _fake.fake_openai

MODEL = "gpt-4o-mini"
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a strict judge."},
    {"role": "user", "content": "Statement 1: the sky is blue."},
]


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Close the test's sync clients: their pooled sockets would otherwise be collected (ResourceWarning) in
    whichever later test the garbage collector happens to run."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(srv: FakeOpenAI, **kw: Any) -> openai.OpenAI:
    kw.setdefault("max_retries", 0)
    client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", **kw)
    _OPEN.append(client)
    return client


def _aclient(srv: FakeOpenAI, **kw: Any) -> openai.AsyncOpenAI:
    kw.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", **kw)


def _ask(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", MESSAGES)
    return client.chat.completions.create(**kw)


def test_default_content_and_completion_shape(fake_openai: FakeOpenAI) -> None:
    resp = _ask(_client(fake_openai))
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    assert resp.model == MODEL
    assert resp.choices[0].index == 0
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == DEFAULT_CONTENT
    assert resp.choices[0].finish_reason == "stop"
    text_len = len("You are a strict judge.\nStatement 1: the sky is blue.")
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == text_len // 4
    assert resp.usage.completion_tokens == len(DEFAULT_CONTENT) // 4
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_responder_round_trip_and_request_recorded(fake_openai: FakeOpenAI) -> None:
    seen: list[dict[str, Any]] = []

    def responder(body: dict[str, Any]) -> str:
        seen.append(body)
        return json.dumps({"verdicts": [{"id": 1, "text": extract_user_text(body, roles=("user",))}]})

    fake_openai.set_responder(responder)
    resp = _ask(_client(fake_openai), response_format={"type": "json_object"}, temperature=0)
    content = json.loads(resp.choices[0].message.content or "")
    assert content == {"verdicts": [{"id": 1, "text": "Statement 1: the sky is blue."}]}

    assert len(fake_openai.requests) == 1
    req = fake_openai.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test"
    assert req["headers"]["content-type"] == "application/json"
    assert req["body"]["model"] == MODEL
    assert req["body"]["response_format"] == {"type": "json_object"}
    assert req["body"] == seen[0]


def test_responder_dict_and_list_content_parts(fake_openai: FakeOpenAI) -> None:
    fake_openai.set_responder(
        lambda body: {
            "content": extract_user_text(body).upper(),
            "finish_reason": "length",
            "headers": {"x-a": "1"},
        }
    )
    msgs = [{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}]
    raw = _client(fake_openai).chat.completions.with_raw_response.create(model=MODEL, messages=msgs)
    assert raw.headers["x-a"] == "1"
    resp = raw.parse()
    assert resp.choices[0].message.content == "ABCD"
    assert resp.choices[0].finish_reason == "length"


def test_reset_restores_default_responder(fake_openai_server: FakeOpenAI) -> None:
    fake_openai_server.set_responder(lambda body: "custom")
    fake_openai_server.enqueue(Status(500))
    fake_openai_server.reset()
    assert fake_openai_server.requests == []
    assert fake_openai_server.pending_faults == 0
    resp = _ask(_client(fake_openai_server))
    assert resp.choices[0].message.content == DEFAULT_CONTENT


def test_429_retry_after_then_success(fake_openai: FakeOpenAI) -> None:
    fake_openai.enqueue(Status(429, headers={"retry-after": "0.2"}))
    t0 = time.monotonic()
    resp = _ask(_client(fake_openai, max_retries=2))
    assert resp.choices[0].message.content == DEFAULT_CONTENT
    assert time.monotonic() - t0 >= 0.2  # retry-after honoured
    assert len(fake_openai.requests) == 2


def test_429_error_body_without_retries(fake_openai: FakeOpenAI) -> None:
    fake_openai.enqueue(
        Status(429, code="insufficient_quota"), Status(401), Status(400, code="context_length_exceeded")
    )
    client = _client(fake_openai)
    with pytest.raises(openai.RateLimitError) as rate:
        _ask(client)
    assert rate.value.status_code == 429
    assert rate.value.code == "insufficient_quota"
    assert rate.value.type == "insufficient_quota"
    with pytest.raises(openai.AuthenticationError) as auth:
        _ask(client)
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as bad:
        _ask(client)
    assert bad.value.code == "context_length_exceeded"
    assert _ask(client).choices[0].message.content == DEFAULT_CONTENT


def test_500_then_success(fake_openai: FakeOpenAI) -> None:
    fake_openai.enqueue(Status(500), Status(503, headers={"retry-after-ms": "10"}))
    client = _client(fake_openai)
    with pytest.raises(openai.InternalServerError) as exc:
        _ask(client)
    assert exc.value.status_code == 500
    assert exc.value.type == "server_error"
    # the SDK retries the 503 by itself
    resp = _ask(client.with_options(max_retries=1))
    assert resp.choices[0].message.content == DEFAULT_CONTENT
    assert len(fake_openai.requests) == 3


def test_delay_past_client_timeout(fake_openai: FakeOpenAI) -> None:
    fake_openai.enqueue(Delay(1.0))
    with pytest.raises(openai.APITimeoutError):  # an answer after 1 s would have been a reply: the timeout fired
        _ask(_client(fake_openai, timeout=0.3))
    assert len(fake_openai.requests) == 1  # recorded even though never answered in time
    # a short delay stays under the timeout and answers normally
    fake_openai.enqueue(Delay(0.05))
    assert _ask(_client(fake_openai, timeout=2.0)).choices[0].message.content == DEFAULT_CONTENT


def test_reset_raises_connection_error(fake_openai: FakeOpenAI) -> None:
    fake_openai.enqueue(Reset())
    client = _client(fake_openai)
    with pytest.raises(openai.APIConnectionError) as exc:
        _ask(client)
    assert not isinstance(exc.value, openai.APITimeoutError)
    assert len(fake_openai.requests) == 1
    # the same client recovers on a fresh connection
    assert _ask(client).choices[0].message.content == DEFAULT_CONTENT


def test_content_fault_with_length_finish_reason(fake_openai: FakeOpenAI) -> None:
    fake_openai.set_responder(lambda body: "not used")
    fake_openai.enqueue(Content('{"verdicts": [{"id": 1, "ver', finish_reason="length"), Content("prose"))
    client = _client(fake_openai)
    first = _ask(client)
    assert first.choices[0].message.content == '{"verdicts": [{"id": 1, "ver'
    assert first.choices[0].finish_reason == "length"
    assert _ask(client).choices[0].message.content == "prose"
    assert _ask(client).choices[0].message.content == "not used"


@pytest.mark.concurrency
def test_reject_json_schema() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "v", "schema": {"type": "object"}}}
    with FakeOpenAI(reject_json_schema=True) as srv:
        client = _client(srv)
        with pytest.raises(openai.BadRequestError) as exc:
            _ask(client, response_format=schema)
        assert exc.value.status_code == 400
        assert exc.value.param == "response_format"
        assert exc.value.code is None
        assert "json_schema is not supported" in exc.value.message
        # JSON mode fallback is accepted
        resp = _ask(client, response_format={"type": "json_object"})
        assert resp.choices[0].message.content == DEFAULT_CONTENT
        assert [r["body"]["response_format"]["type"] for r in srv.requests] == ["json_schema", "json_object"]


def test_stream_unknown_path_and_models(fake_openai: FakeOpenAI) -> None:
    client = _client(fake_openai)
    with pytest.raises(openai.BadRequestError):
        _ask(client, stream=True)
    models = client.models.list()
    assert [m.id for m in models.data] == ["gpt-4o-mini"]
    with httpx.Client() as http:
        r = http.post(fake_openai.base_url + "/embeddings", json={"input": "x"})
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert int(r.headers["content-length"]) == len(r.content)
        r = http.post(fake_openai.base_url + "/chat/completions", content=b"{not json")
        assert r.status_code == 400
    assert [r["path"] for r in fake_openai.requests][-2:] == ["/v1/embeddings", "/v1/chat/completions"]


def test_responder_exception_is_500_and_kept(fake_openai: FakeOpenAI) -> None:
    def boom(body: dict[str, Any]) -> str:
        raise ValueError("scripted judge failed")

    fake_openai.set_responder(boom)
    with pytest.raises(openai.InternalServerError):
        _ask(_client(fake_openai))
    assert len(fake_openai.errors) == 1 and isinstance(fake_openai.errors[0], ValueError)


@pytest.mark.concurrency
def test_200_concurrent_async_requests() -> None:
    """200 requests in flight at once: no answer leaves before the 200th request has arrived (a server or client
    handling them one by one would never see the 200th: the test fails after 60 s). Before, the test asserted a
    duration, which a loaded machine broke (22 s against 10)."""
    n = 200
    arrived: list[int] = []
    lock, everyone = threading.Lock(), threading.Event()

    def wait_for_all(body: dict[str, Any]) -> str:
        with lock:
            arrived.append(1)
            if len(arrived) == n:
                everyone.set()
        assert everyone.wait(timeout=60), f"only {len(arrived)} of {n} requests in flight together"
        return extract_user_text(body)

    async def run(srv: FakeOpenAI) -> list[str]:
        client = _aclient(srv, timeout=90.0)
        try:
            coros = [
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"item {i}"}])
                for i in range(n)
            ]
            resps = await asyncio.gather(*coros)
        finally:
            await client.close()
        return [r.choices[0].message.content or "" for r in resps]

    with FakeOpenAI(responder=wait_for_all) as srv:
        contents = asyncio.run(run(srv))
    assert contents == [f"item {i}" for i in range(n)]
    assert len(srv.requests) == n and srv.errors == []


def _outcomes(srv: FakeOpenAI, n: int) -> Counter[str]:
    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        try:
            resp = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{i}"}])
        except openai.APIStatusError as exc:
            return f"status:{exc.status_code}"
        except openai.APIConnectionError:
            return "connection"
        content = resp.choices[0].message.content or ""
        try:
            json.loads(content)
        except ValueError:
            return "malformed"
        return "ok" if content == DEFAULT_CONTENT else "malformed"

    async def run() -> Counter[str]:
        client = _aclient(srv, timeout=10.0)
        try:
            return Counter(await asyncio.gather(*(one(client, i) for i in range(n))))
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.mark.concurrency
def test_fault_rate_mix_is_deterministic() -> None:
    n = 150
    with FakeOpenAI(fault_rate=0.3, malformed_rate=0.2, seed=1) as srv:
        first = _outcomes(srv, n)
        stats1 = Counter(srv.stats)
        srv.reset()  # re-seeds the RNG
        second = _outcomes(srv, n)
        stats2 = Counter(srv.stats)
    assert sum(first.values()) == n
    # a real mix of outcomes
    for kind in ("ok", "status:429", "status:500", "status:503", "connection"):
        assert first[kind] > 0, first
    assert first["ok"] > n // 3
    assert stats1["malformed:truncated"] + stats1["malformed:prose"] + stats1["malformed:wrong_shape"] > 0
    faults = sum(v for k, v in stats1.items() if k.startswith("fault:"))
    assert 0.15 * n < faults < 0.45 * n
    assert stats1["requests"] == n
    # the same seed gives the same counts, whatever the arrival order
    assert stats1 == stats2
    assert first["connection"] == second["connection"] == stats1["fault:reset"]


def test_fixture_contract(fake_openai_server: FakeOpenAI, fake_openai: FakeOpenAI) -> None:
    assert fake_openai is fake_openai_server
    assert fake_openai.base_url.startswith("http://127.0.0.1:") and fake_openai.base_url.endswith("/v1")
    assert fake_openai.requests == []


def test_late_answer_after_reset_uses_its_own_responder(fake_openai: FakeOpenAI) -> None:
    fake_openai.set_responder(lambda body: "old")
    fake_openai.enqueue(Delay(0.3))
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(resp=_ask(_client(fake_openai, timeout=5.0))))
    worker.start()
    assert fake_openai.wait_for_requests(1, timeout=5.0)
    fake_openai.reset()  # next test starts while the delayed request is still in flight

    def boom(body: dict[str, Any]) -> str:
        raise AssertionError("must not be called for the old request")

    fake_openai.set_responder(boom)
    worker.join(timeout=5.0)
    assert result["resp"].choices[0].message.content == "old"
    assert fake_openai.requests == [] and fake_openai.errors == [] and not fake_openai.stats


# --------------------------------------------------------------------------------------------- Batch API


def _batch_lines(n: int) -> bytes:
    return "".join(
        json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "messages": [{"role": "user", "content": f"line {i}"}]}}) + "\n"
        for i in range(n)
    ).encode()  # fmt: skip


def _submit(client: openai.OpenAI, n: int = 6) -> Any:
    upload = client.files.create(file=("in.jsonl", _batch_lines(n)), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()] if file_id else []


def test_batch_completes_with_the_chat_responder_in_shuffled_order(fake_openai: FakeOpenAI) -> None:
    fake_openai.set_responder(lambda body: {"content": extract_user_text(body).upper()})
    client = _client(fake_openai)
    batch = _submit(client, 20)
    assert batch.status == "validating"
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts.completed == 20 and done.error_file_id is None
    out = _lines(client, done.output_file_id)
    ids = [x["custom_id"] for x in out]
    assert sorted(ids, key=lambda k: int(k[1:])) == [f"k{i}" for i in range(20)] and ids != sorted(ids)
    assert {x["response"]["body"]["choices"][0]["message"]["content"] for x in out} == {f"LINE {i}" for i in range(20)}
    assert fake_openai.chat_requests == [] and len(fake_openai.uploads) == 1


def test_batch_held_failed_lines_expired_failed_cancelled(fake_openai: FakeOpenAI) -> None:
    client = _client(fake_openai)
    fake_openai.batch_hold = True
    fake_openai.batch_fail_line = lambda custom_id, body: custom_id == "k1"
    held = _submit(client, 4)
    assert client.batches.retrieve(held.id).status == "in_progress"
    fake_openai.finish_batches()
    done = client.batches.retrieve(held.id)
    assert done.status == "completed" and done.request_counts.failed == 1
    assert [x["custom_id"] for x in _lines(client, done.error_file_id)] == ["k1"]
    expiring = _submit(client, 4)
    fake_openai.finish_batches("expired")
    expired = client.batches.retrieve(expiring.id)
    assert expired.status == "expired" and len(_lines(client, expired.output_file_id)) == 1  # k1 failed
    assert {x["error"]["code"] for x in _lines(client, expired.error_file_id) if x["error"]} == {"batch_expired"}
    failing = _submit(client, 2)
    fake_openai.finish_batches("failed")
    assert client.batches.retrieve(failing.id).status == "failed"
    outside = _submit(client, 2)
    fake_openai.cancel_batch_outside(outside.id)
    assert client.batches.retrieve(outside.id).status == "cancelled"
    mine = _submit(client, 2)
    assert client.batches.cancel(mine.id).status == "cancelled"


def test_batch_controls_truncate_unknown_create_fault_and_no_support(fake_openai: FakeOpenAI) -> None:
    client = _client(fake_openai)
    fake_openai.batch_truncate_output = True
    fake_openai.batch_unknown_line = True
    done = client.batches.retrieve(_submit(client, 3).id)
    text = client.files.content(done.output_file_id).text
    assert not text.endswith("\n") and len(text.splitlines()) == 4
    fake_openai.batch_create_faults = [500]
    upload = client.files.create(file=("in.jsonl", _batch_lines(1)), purpose="batch")
    with pytest.raises(openai.InternalServerError):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert [f.filename for f in client.files.list(purpose="batch").data] == ["in.jsonl", "in.jsonl"]
    fake_openai.batch_supported = False
    with pytest.raises(openai.NotFoundError):
        client.batches.list()
    with pytest.raises(openai.NotFoundError):
        client.files.create(file=("in.jsonl", _batch_lines(1)), purpose="batch")


@pytest.mark.concurrency
def test_batch_and_file_lists_are_newest_first_a_page_at_a_time() -> None:
    """As OpenAI lists them: newest first, ``after`` / ``limit`` / ``has_more`` (the SDK pages through them)."""
    with FakeOpenAI() as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        files = [client.files.create(file=(f"f{i}.jsonl", b""), purpose="batch").id for i in range(3)]
        batches = [client.batches.create(input_file_id=f, endpoint="/v1/chat/completions", completion_window="24h").id
                   for f in files]  # fmt: skip
        page = client.batches.list(limit=2)
        assert [b.id for b in page.data] == batches[:0:-1] and page.has_more
        rest = client.batches.list(limit=2, after=page.data[-1].id)
        assert [b.id for b in rest.data] == batches[:1] and not rest.has_more
        assert [b.id for b in client.batches.list(limit=2)] == batches[::-1]  # auto-paging: every page
        assert [f.id for f in client.files.list(purpose="batch")] == files[::-1]
        first = client.batches.retrieve(batches[0]).model_dump()
        assert {"cancelling_at", "finalizing_at", "request_counts", "metadata"} <= set(first)
        assert {"expires_at", "status_details"} <= set(client.files.retrieve(files[0]).model_dump(exclude_unset=True))
