"""The openai SDK's private members the judge uses (``judges/_openai_compat.py``) exist on the installed SDK.

mypy checks them against the locked SDK; this test checks the installed one, so ``make test-oldest-openai`` (which
runs it) says which member an older SDK lacks instead of failing at a distance. And no module but the compat module
reaches into the SDK's privates.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx2
import openai
import pytest

from recall_tasks.judges import _openai_compat as compat

PACKAGE = Path(__file__).resolve().parents[1] / "recall_tasks"


def listed(protocol: type) -> list[str]:
    """The members a protocol lists: its annotated attributes, methods and properties."""
    names = set(protocol.__dict__.get("__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if callable(v) or isinstance(v, property)}
    return sorted(n for n in names if not n.startswith("__") and n not in ("_is_protocol", "_is_runtime_protocol"))


def test_the_protocols_list_the_members_used():
    assert "_build_request" in listed(compat.SDKClient) and "max_retries" in listed(compat.SDKClient)
    assert listed(compat.HttpClient) == ["_mounts", "_transport"]
    assert "get_client" in listed(compat.AiohttpTransport)


@pytest.mark.concurrency  # the SDK's get_platform() may run `uname` once per process
def test_the_installed_sdk_has_every_listed_member():
    async def check() -> list[str]:
        client = openai.AsyncOpenAI(api_key="sk-test-compat", base_url="http://127.0.0.1:9/v1",
                                    http_client=openai.DefaultAioHttpClient())  # fmt: skip
        try:
            http = compat.http_client(client)
            transport = compat.aiohttp_transport(compat.base_transport(http))
            assert transport is not None, "openai[aiohttp]: the SDK's aiohttp transport"
            missing = [f"AsyncOpenAI.{n}" for n in listed(compat.SDKClient) if not hasattr(client, n)]
            missing += [f"httpx2.AsyncClient.{n}" for n in listed(compat.HttpClient) if not hasattr(http, n)]
            missing += [f"AiohttpTransport.{n}" for n in listed(compat.AiohttpTransport) if not hasattr(transport, n)]
            request = await compat.chat_request(client, compat.chat_options())
            assert str(request.url) == "http://127.0.0.1:9/v1/chat/completions"
            assert request.headers["authorization"] == "Bearer sk-test-compat"
            assert compat.plain_client(client)
            reply = httpx2.Response(429, headers={"x-should-retry": "false"}, request=request)
            assert not compat.should_retry(client, reply)
            assert isinstance(compat.status_error(client, reply), openai.RateLimitError)
            return missing
        finally:
            await client.close()

    assert asyncio.run(check()) == []


#: ``openai._models``, ``client._build_request``, ``http._mounts``, ``x._platform``... (not dunders, not our own)
PRIVATE = re.compile(r"\bopenai\._[a-z]\w*|\b(client|http)\._[a-z]\w*|\._(platform|idempotency_header|mounts)\b")


def test_no_module_but_the_compat_module_reaches_into_the_sdk():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_openai_compat.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if PRIVATE.search(code.replace('"openai._base_client"', "")):  # a logger's name is not an access
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == []
