"""The judge's own HTTP/1.1 connections (``judges/_http1.py``) against the real fake server: reuse, closes, redirects.

``test_openai_lean.py`` compares every fault and framing with the SDK path; these check what only a run of many
requests shows: connections are kept alive and reused, a connection the server closes is never used again, a
redirect is followed (on aiohttp), and an endpoint that refuses connections fails as on the SDK path.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
from pathlib import Path
from typing import Any

from recall_tasks import ContextualRecall, OpenAIJudge, RecallCase
from recall_tasks.errors import JudgeError
from recall_tasks.judges._openai_lean import LeanChat
from tests.fake_openai import FakeOpenAI, Framed, Status

REPLY = {"verdicts": [{"id": 1, "chunk_ids": [1], "reason": "", "verdict": "yes"}], "summary": ""}


def case(i: int) -> RecallCase:
    return RecallCase(input=f"q{i}", expected_output=f"Fact number {i} holds.", retrieval_context=[f"Fact {i}."])


def lean_of(judge: OpenAIJudge) -> LeanChat:
    lean = judge._state().lean
    assert isinstance(lean, LeanChat)
    return lean


def test_connections_are_kept_alive_and_one_the_server_closes_is_never_reused(fake_openai):
    fake_openai.set_responder(lambda body: json.dumps(REPLY))
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=fake_openai.base_url, api_key="sk-h1", max_concurrency=4)
    metric = ContextualRecall(judge=judge)

    async def run() -> dict[str, Any]:
        got: dict[str, Any] = {}
        results = await asyncio.gather(*(metric.a_measure(case(i)) for i in range(40)))
        assert lean_of(judge)._pool is not None, "the lean path did not use its own connections"
        got["scores"] = {r.score for r in results}
        got["requests"] = sum(r.metadata.requests for r in results)
        got["connections"] = fake_openai.stats["connections"]
        # the server says it closes (Connection: close), then closes without saying so (an idle timeout)
        fake_openai.enqueue(Framed(close=True), Framed(chunked=True, close=True), Framed(drop=True))
        after = []
        for i in range(3):
            after.append(await metric.a_measure(case(100 + i)))
            await asyncio.sleep(0.05)  # the server's close reaches the client before its next request
        after += await asyncio.gather(*(metric.a_measure(case(200 + i)) for i in range(4)))  # 4 in flight again
        got["after"] = [(r.score, r.metadata.requests) for r in after]
        got["connections_after"] = fake_openai.stats["connections"]
        await judge.aclose()
        return got

    got = asyncio.run(run())
    assert got["scores"] == {1.0} and got["requests"] == 40
    assert got["connections"] <= 4, "keep-alive: at most one connection per request in flight"
    # no request went out on a closed connection (no retry: one request each), and the 3 closed were replaced
    assert got["after"] == [(1.0, 1)] * 7
    assert got["connections_after"] - got["connections"] == 3
    assert fake_openai.stats["requests"] == 47


def test_a_redirect_is_followed_on_aiohttp_from_then_on(fake_openai):
    fake_openai.set_responder(lambda body: json.dumps(REPLY))
    target = f"{fake_openai.base_url}/chat/completions"
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=fake_openai.base_url, api_key="sk-h1", max_retries=0)
    metric = ContextualRecall(judge=judge)

    async def run() -> tuple[list[float | None], bool, bool]:
        first = await metric.a_measure(case(0))
        pooled = lean_of(judge)._pool is not None
        fake_openai.enqueue(Status(307, headers={"location": target}, body=""))
        second = await metric.a_measure(case(1))
        third = await metric.a_measure(case(2))
        still_pooled = lean_of(judge)._pool is not None
        await judge.aclose()
        return [first.score, second.score, third.score], pooled, still_pooled

    scores, pooled, still_pooled = asyncio.run(run())
    assert scores == [1.0, 1.0, 1.0]
    assert pooled and not still_pooled
    assert fake_openai.stats["queued:status"] == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def judged(url: str, lean: bool, rows: int = 6) -> dict[str, Any]:
    """``rows`` rows judged at ``url`` on the lean path or the SDK's: scores, requests and whether the lean path
    sent over TLS on its own connections, or the error (type, text, requests)."""
    judge = OpenAIJudge(model="gpt-4o-mini", base_url=url, api_key="sk-h1", max_retries=1)
    metric = ContextualRecall(judge=judge)

    async def run() -> dict[str, Any]:
        if not lean:
            judge._state().lean = None
        try:
            results = await asyncio.gather(*(metric.a_measure(case(i)) for i in range(rows)))
            pool = getattr(judge._state().lean, "_pool", None)
            return {
                "scores": [r.score for r in results],
                "requests": sum(r.metadata.requests for r in results),
                "pooled_tls": pool is not None and pool.is_ssl,
            }
        except JudgeError as exc:
            return {"error": (type(exc).__name__, str(exc), getattr(exc, "requests", None))}
        finally:
            await judge.aclose()

    return asyncio.run(run())


def test_a_refused_connection_fails_as_on_the_sdk_path():
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    sdk, lean = judged(url, False, rows=1), judged(url, True, rows=1)
    assert lean == sdk
    assert "refused" in sdk["error"][1], sdk


def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, signed by its own key (its own CA): cert and key files."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


def test_https_endpoints_verify_the_certificate_and_answer_as_on_the_sdk_path(tmp_path, monkeypatch):
    """The judge's own connections speak TLS with the SDK's verification: a certificate the trust store holds
    is accepted and every row is judged as on the SDK path; one it does not hold fails both paths alike."""
    cert, key = self_signed(tmp_path, "judge")
    other, _ = self_signed(tmp_path, "other")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    with FakeOpenAI(lambda body: json.dumps(REPLY), tls=server_tls) as server:
        assert server.base_url.startswith("https://")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the SDK's trust store (httpx2: SSL_CERT_FILE)
        sdk, lean = judged(server.base_url, False), judged(server.base_url, True)
        assert sdk == {"scores": [1.0] * 6, "requests": 6, "pooled_tls": False}
        assert lean == {**sdk, "pooled_tls": True}
        bodies = [r["raw"] for r in server.chat_requests]
        assert len(bodies) == 12 and sorted(bodies[:6]) == sorted(bodies[6:])

        monkeypatch.setenv("SSL_CERT_FILE", str(other))  # a trust store without the server's certificate
        sdk, lean = judged(server.base_url, False), judged(server.base_url, True)
        assert "error" in sdk and lean == sdk
        assert "TLS" in sdk["error"][1] or "certificate" in sdk["error"][1].lower(), sdk
