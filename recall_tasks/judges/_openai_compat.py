"""Every private member of the openai SDK that recall-bench uses, in one module.

The judge leans on the SDK beyond its public API in two places: :func:`~recall_tasks.judges._openai_http.
build_client` wraps the transports of the SDK's httpx2 client (every attempt observed and bounded), and the lean
chat path (:mod:`~recall_tasks.judges._openai_lean`) builds its requests, retries and errors with the SDK's own
private functions. Each access is a function here, and the members they use are listed by :class:`SDKClient`,
:class:`HttpClient` and :class:`AiohttpTransport`: mypy checks the lists against the locked SDK
(:func:`_conforms`), ``tests/test_openai_compat.py`` against the installed one, and ``make test-oldest-openai``
runs the judge's tests on the oldest SDK that pyproject.toml allows. An SDK that moves one of them breaks here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import httpx2
import openai

if TYPE_CHECKING:
    from openai._models import FinalRequestOptions


class SDKClient(Protocol):
    """The members of ``openai.AsyncOpenAI`` used here (its private ones, and ``max_retries`` and ``custom_auth``)."""

    max_retries: int
    _client: httpx2.AsyncClient
    _platform: Any  # openai._base_client.Platform | None: what get_platform() found, once
    _idempotency_header: str | None

    @property
    def custom_auth(self) -> httpx2.Auth | None: ...

    async def _prepare_options(self, options: FinalRequestOptions) -> FinalRequestOptions: ...

    def _build_request(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Request: ...

    async def _prepare_request(self, request: httpx2.Request) -> None: ...

    def _should_retry(self, response: httpx2.Response) -> bool: ...

    def _make_status_error_from_response(self, response: httpx2.Response) -> openai.APIStatusError: ...

    def _calculate_retry_timeout(
        self, remaining_retries: int, options: FinalRequestOptions, response_headers: httpx2.Headers | None = None
    ) -> float: ...


#: Members of newer SDKs only, read when present (a client using either is not plain: :func:`plain_client`).
NEWER_MEMBERS = ("_workload_identity_auth", "_provider_runtime")


class HttpClient(Protocol):
    """The members of the SDK's ``httpx2.AsyncClient`` used here: its transport and its mounts (proxies)."""

    _transport: httpx2.AsyncBaseTransport
    _mounts: dict[Any, httpx2.AsyncBaseTransport | None]


class AiohttpTransport(Protocol):
    """The members of the SDK's vendored aiohttp transport (``openai._vendor.httpx_aiohttp``) used here."""

    client: Any  # its aiohttp session, or a factory of one until the first request
    proxy: Any
    uds: str | None
    limits: httpx2.Limits
    ssl_context: Any
    local_address: str | None

    def get_client(self) -> aiohttp.ClientSession: ...


if TYPE_CHECKING:
    from openai._vendor.httpx_aiohttp.transport import AiohttpTransport as _VendoredTransport

    def _conforms(
        client: openai.AsyncOpenAI, http: httpx2.AsyncClient, transport: _VendoredTransport
    ) -> tuple[SDKClient, HttpClient, AiohttpTransport]:
        """mypy: the locked SDK still has every member listed above, with these signatures."""
        return client, http, transport


def sdk(client: openai.AsyncOpenAI) -> SDKClient:
    """``client`` seen through the members this module uses."""
    return client


def http_client(client: openai.AsyncOpenAI) -> HttpClient:
    """The SDK client's httpx2 client."""
    return client._client


def transports(http: HttpClient) -> list[httpx2.AsyncBaseTransport]:
    """Every transport an attempt may go through: the client's, then its mounts' (proxies from HTTP(S)_PROXY)."""
    return [http._transport, *(t for t in http._mounts.values() if t is not None)]


def base_transport(http: HttpClient) -> httpx2.AsyncBaseTransport:
    """The client's own transport (not a mount's)."""
    return http._transport


def has_mounts(http: HttpClient) -> bool:
    return any(t is not None for t in http._mounts.values())


def wrap_transports(http: HttpClient, wrap: Callable[[httpx2.AsyncBaseTransport], httpx2.AsyncBaseTransport]) -> None:
    """Put ``wrap`` around the client's transport and every mount's."""
    http._transport = wrap(http._transport)
    http._mounts = {pattern: None if t is None else wrap(t) for pattern, t in http._mounts.items()}


def aiohttp_transport(transport: object) -> AiohttpTransport | None:
    """``transport`` when it is the SDK's aiohttp transport (``openai[aiohttp]``), else None."""
    try:
        from openai._vendor.httpx_aiohttp.transport import AiohttpTransport as Vendored
    except ImportError:
        return None
    return transport if isinstance(transport, Vendored) else None


def aiohttp_error_mapping() -> Callable[[], AbstractContextManager[None]]:
    """The SDK's mapping of aiohttp's exceptions to httpx2's (what its transport raises), as a context manager."""
    from openai._vendor.httpx_aiohttp.transport import map_aiohttp_exceptions

    return map_aiohttp_exceptions


def plain_client(client: openai.AsyncOpenAI) -> bool:
    """A plain ``AsyncOpenAI``: not Azure or another subclass, no custom auth, workload identity, provider runtime
    or idempotency header (a key per request: a template of the request cannot hold it)."""
    if type(client) is not openai.AsyncOpenAI or client.custom_auth is not None:
        return False
    if getattr(client, NEWER_MEMBERS[0], None) is not None or getattr(client, NEWER_MEMBERS[1], None):
        return False
    return not sdk(client)._idempotency_header


def chat_options() -> FinalRequestOptions:
    """The SDK's options of a ``POST /chat/completions`` (no body: the caller sends its own bytes)."""
    from openai._models import FinalRequestOptions

    return FinalRequestOptions.construct(method="post", url="/chat/completions")


async def chat_request(client: openai.AsyncOpenAI, options: FinalRequestOptions) -> httpx2.Request:
    """The request the SDK's ``request()`` builds for ``options`` before sending it: URL, headers, auth."""
    from openai._base_client import get_platform
    from openai._compat import model_copy

    members = sdk(client)
    if members._platform is None:  # as the SDK's request(): it may do blocking I/O
        members._platform = await asyncio.to_thread(get_platform)
    prepared = await members._prepare_options(model_copy(options))
    request = members._build_request(prepared, retries_taken=0)
    await members._prepare_request(request)
    return request


def should_retry(client: openai.AsyncOpenAI, reply: httpx2.Response) -> bool:
    """The SDK's retry rule for a reply (Retry-After, ``x-should-retry``, 408/409/429/5xx)."""
    return sdk(client)._should_retry(reply)


def retry_delay(
    client: openai.AsyncOpenAI, remaining: int, options: FinalRequestOptions, headers: httpx2.Headers | None
) -> float:
    """The SDK's delay before a retry (Retry-After, else its jittered backoff)."""
    return sdk(client)._calculate_retry_timeout(remaining, options, headers)


def status_error(client: openai.AsyncOpenAI, reply: httpx2.Response) -> openai.APIStatusError:
    """The SDK's typed error for a non-2xx reply (``RateLimitError``, ``AuthenticationError``...)."""
    return sdk(client)._make_status_error_from_response(reply)
