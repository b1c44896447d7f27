"""OpenAIJudge: one structured-output chat completion per case against any OpenAI-compatible endpoint.

Decisions worth knowing:
- One ``AsyncOpenAI`` client per judge and event loop (httpx pools are bound to a loop); the sync API runs
  every coroutine on one background loop (``recall_tasks._sync``), so in practice there is one client.
- Transient failures (429 with Retry-After, 408/409/5xx, timeouts, connection resets) are retried by the
  SDK's own jittered backoff (``max_retries``). A 429 whose body says ``insufficient_quota`` is marked
  not-retryable by a response hook, and surfaces as :class:`JudgeConfigError` with auth, 400, 403 and 404.
- ``response_format``: JSON schema (strict) first; if the endpoint rejects it, JSON mode, then none; the
  judge remembers what worked. Replies are parsed tolerantly, and an unusable reply gets one repair request.
  ``finish_reason == "length"`` is retried once with twice the completion budget.
- The Batch API and claim extraction: mixins in :mod:`recall_tasks.judges._openai_extras`.
- The wire format (request body, reading a reply, the repair request): :mod:`recall_tasks.judges._openai_wire`;
  HTTP (clients, what a failed attempt means, SDK errors): :mod:`recall_tasks.judges._openai_http` and the
  modules it names.
- A verdict request is counted against the model's context window before it is sent, and refused, cut or sent
  as ``on_overlong`` says (:mod:`recall_tasks.judges.context_window`).
- Requests and tokens per minute are limited per loop; ``max_concurrency`` bounds calls in flight. With grant
  sources (:meth:`OpenAIJudge.share_limits`, the pipeline's fleet-wide limits) the limiters also spend grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import openai

from recall_tasks.errors import JudgeConfigError, JudgeResponseError
from recall_tasks.judges import _openai_wire as wire
from recall_tasks.judges import context_window, prompts, tokens
from recall_tasks.judges._openai_attempts import counted_attempts
from recall_tasks.judges._openai_errors import _error_text, check_key, translate_error
from recall_tasks.judges._openai_extras import BatchMixin, ClaimsMixin
from recall_tasks.judges._openai_http import (
    _close_states,
    _close_with_loop,
    _LoopState,
    build_client,
    endpoint_host,
    post_chat,
)
from recall_tasks.judges.base import (
    SUBSTITUTED_FLAG,
    JudgeRequest,
    JudgeResponse,
    Spend,
    attempt_gate,
    charge,
    other_model,
)
from recall_tasks.judges.pricing import PRICES_PER_MTOK, price_for
from recall_tasks.judges.ratelimit import GrantSource, RateLimiter
from recall_tasks.secrets import register_secret
from recall_tasks.settings import settings as env_settings

if TYPE_CHECKING:
    from recall_tasks.judges.capabilities import FullJudge

log = logging.getLogger(__name__)


class OpenAIJudge(BatchMixin, ClaimsMixin):
    """A judge backed by any OpenAI-compatible chat-completions endpoint (OpenAI, Azure, vLLM, Ollama...)."""

    #: every HTTP attempt reserves the run's budget before it is sent (``judges.base.AttemptGate``)
    gates_attempts = True

    def __init__(
        self,
        model: str = "gpt-4o-mini",
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = 0.0,
        max_concurrency: int = 64,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        prices: dict[str, tuple[float, float]] | None = None,
        prompt_version: str = prompts.PROMPT_VERSION,
        max_tokens_param: str | None = None,
        response_format: str = "json_schema",
        azure: dict[str, str] | None = None,
        context_window_tokens: int | None = None,
        on_overlong: str = "refuse",
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if response_format not in wire.FORMATS:
            raise ValueError(f"response_format must be one of {wire.FORMATS}")
        if on_overlong not in context_window.POLICIES:
            raise ValueError(f"on_overlong must be one of {context_window.POLICIES}")
        #: the model's context window (None: unknown, not checked) and what to do with a request over it
        self.context_window = context_window.window_for(model, context_window_tokens)
        self.on_overlong = on_overlong
        self._model = model
        env = env_settings()
        self.base_url = base_url or env.openai_base_url or None
        env_key = env.openai_api_key.get_secret_value() if env.openai_api_key else None
        key = api_key or env_key or (azure or {}).get("api_key")
        official = self.base_url is None or "openai.com" in self.base_url or azure is not None
        # a self-hosted endpoint (vLLM, Ollama...) may need no key: the pre-flight probe tells (401 or not)
        if azure is None and not key and official:
            raise JudgeConfigError(
                "no API key for the OpenAI judge: set OPENAI_API_KEY (use --judge lexical to run offline)",
                model=model,
            )
        if key:
            register_secret(key)
            check_key(key, model, azure=azure is not None)
        self._api_key = key or ""
        self.temperature = temperature
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.prices = {**PRICES_PER_MTOK, **(prices or {})}
        self._prompt_version = prompt_version
        self.max_tokens_param = max_tokens_param or ("max_completion_tokens" if official else "max_tokens")
        self._format = response_format
        self._azure = {k: v for k, v in (azure or {}).items() if k != "api_key"}
        #: ``host[:port]`` named in error texts and the breaker's reason (never credentials or paths)
        self.endpoint = endpoint_host(self._azure["azure_endpoint"] if self._azure else self.base_url)
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._grants: dict[str, tuple[GrantSource, int]] = {}  # "rpm"/"tpm" -> (source, units per grant)
        weakref.finalize(self, _close_states, self._states)  # a judge dropped without aclose() closes its clients

    @classmethod
    def azure(
        cls,
        deployment: str,
        azure_endpoint: str | None = None,
        api_version: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> OpenAIJudge:
        """A judge on an Azure OpenAI deployment (endpoint, version and key default to AZURE_OPENAI_* env)."""
        env = env_settings()
        env_key = env.azure_openai_api_key.get_secret_value() if env.azure_openai_api_key else ""
        settings = {
            "azure_endpoint": azure_endpoint or env.azure_openai_endpoint or "",
            "api_version": api_version or env.openai_api_version,
            "api_key": api_key or env_key,
        }
        if not settings["azure_endpoint"]:
            raise JudgeConfigError("Azure judge needs azure_endpoint or AZURE_OPENAI_ENDPOINT", model=deployment)
        if not settings["api_key"]:
            raise JudgeConfigError("Azure judge needs api_key or AZURE_OPENAI_API_KEY", model=deployment)
        return cls(model=deployment, azure=settings, api_key=settings["api_key"], **kwargs)

    @property
    def model(self) -> str:
        return self._model

    def share_limits(self, rpm: tuple[GrantSource, int] | None, tpm: tuple[GrantSource, int] | None) -> None:
        """Take ``--rpm``/``--tpm`` budget from these grant sources too (source, units per grant); before any call."""
        self._grants = {k: v for k, v in (("rpm", rpm), ("tpm", tpm)) if v is not None}

    def rate_limiters(self) -> list[RateLimiter]:
        """The limiters of every loop this judge ran on (their grant counters: logs, benchmarks)."""
        return [lim for state in list(self._states.values()) for lim in (state.rpm, state.tpm) if lim is not None]

    def _limiter(self, kind: str, per_minute: float | None) -> RateLimiter | None:
        if not per_minute:
            return None
        source, grant = self._grants.get(kind, (None, 1))
        return RateLimiter(per_minute, source, grant)

    @property
    def prompt_version(self) -> str:
        return self._prompt_version

    def config(self) -> dict[str, Any]:
        """What changes verdicts: part of cache keys. No key, no endpoint credentials. A cut context changes what
        the judge sees: ``on_overlong="truncate"`` and the window are part of it (the default leaves it as it was)."""
        config = {
            "judge": "openai",
            "model": self._model,
            "prompt_version": self._prompt_version,
            "schema_version": prompts.SCHEMA_VERSION,
            "temperature": self.temperature,
        }
        if self.on_overlong == "truncate" and self.context_window is not None:
            config.update(on_overlong="truncate", context_window=self.context_window)
        return config

    def __repr__(self) -> str:
        return f"OpenAIJudge(model={self._model!r}, base_url={self.base_url!r})"

    # -- clients ---------------------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            client = build_client(
                self.base_url,
                self._api_key,
                self._azure,
                self.endpoint,
                self.timeout_s,
                self.max_retries,
                self.max_concurrency,
            )
            state = _LoopState(
                client=client,
                semaphore=asyncio.Semaphore(self.max_concurrency),
                rpm=self._limiter("rpm", self.requests_per_minute),
                tpm=self._limiter("tpm", self.tokens_per_minute),
            )
            self._states[loop] = state
            state.closer = _close_with_loop(self._states, loop)
            asyncio.ensure_future(state.closer.__anext__())  # runs to its yield on the loop's next turn
        return state

    def preflight(self) -> str | None:
        """One cheap request before any judge call (see :mod:`recall_tasks.judges.preflight`)."""
        from recall_tasks.judges.preflight import check_endpoint

        azure = dict(self._azure) if self._azure else None
        return check_endpoint(model=self._model, base_url=self.base_url, api_key=self._api_key, azure=azure)

    async def aclose(self) -> None:
        """Close the client of the running loop (its HTTP sessions too: nothing is left unclosed at exit)."""
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.close()
        for source, _ in self._grants.values():
            await source.aclose()

    async def __aenter__(self) -> OpenAIJudge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- judging ---------------------------------------------------------------------------------

    def tokens_needed(self, request: JudgeRequest) -> int:
        """The prompt tokens (at most) of the first request for ``request`` plus its completion budget: what must
        fit :attr:`context_window`, and what ``--tpm`` charges, the cost cap reserves and ``--batch`` admits for it
        (:func:`~recall_tasks.judges.tokens.request_tokens` of its body)."""
        return sum(tokens.request_tokens(self.batch_body(request)))

    def tokens_at_most(self, request: JudgeRequest) -> int:
        """An upper bound of :meth:`tokens_needed` that counts nothing
        (:func:`~recall_tasks.judges.context_window.tokens_at_most`)."""
        return context_window.tokens_at_most(*self._window_inputs(request))

    def _window_inputs(self, request: JudgeRequest) -> tuple[list[dict[str, str]], int, dict[str, Any] | None]:
        """What counts against the window: the first request's messages, its completion budget, its schema."""
        schema = wire.VERDICTS[1] if self._format == "json_schema" else None
        return prompts.messages(request, self._prompt_version), wire.verdict_budget(request), schema

    async def judge(self, request: JudgeRequest) -> JudgeResponse:
        """Ask the endpoint for one verdict per statement; one request in the normal path.

        A request over the model's context window is refused (:class:`~recall_tasks.errors.ContextOverflowError`,
        nothing sent), cut or sent, as :attr:`on_overlong` says."""
        cut = None
        if self.context_window is not None:
            request, cut = context_window.fit(
                request, self.tokens_needed, self.context_window, self.on_overlong, self._model, self.tokens_at_most
            )
        state = self._state()
        msgs = prompts.messages(request, self._prompt_version)
        budget = wire.verdict_budget(request)
        usage = [0, 0]
        models: list[str] = []
        with self._billed_on_failure(usage), counted_attempts() as counter:
            async with state.semaphore:
                content = await self._complete(state, msgs, budget, usage, models=models)
                parsed = await wire.parse_or_repair(
                    request, msgs, content, self._model,
                    lambda repair: self._complete(state, repair, budget, usage, models=models),
                )  # fmt: skip
        cost = self._cost(usage)
        replied = self._replied(models)
        extra = [] if cut is None else [cut]
        if replied[1]:
            extra.append(f"{SUBSTITUTED_FLAG}{replied[0]}, not {self._model} as asked (not cached)")
        if extra:
            parsed = (parsed[0], parsed[1], [*extra, *parsed[2]])
        return wire.verdict_response(
            request, parsed, usage, counter[0], cost, model=self._model, prompt_version=self._prompt_version,
            replied=replied,
        )  # fmt: skip

    def _replied(self, models: list[str]) -> tuple[str | None, bool]:
        """The model the call's replies named (one of another model first, else the last) and whether it is another
        model than the one asked for. Azure's replies name the deployment's model, not its name: never another."""
        other = next((m for m in models if other_model(self._model, m)), None)
        if other is not None and not self._azure:
            return other, True
        return (models[-1] if models else None), False

    @contextlib.contextmanager
    def _billed_on_failure(self, usage: list[int]) -> Iterator[None]:
        """A call that fails after replies came back (truncated twice, unusable after the repair) carries their
        tokens and cost on its exception (``charge``); its attempts are ``exc.requests`` (``counted_attempts``)."""
        try:
            yield
        except BaseException as exc:
            charge(exc, Spend(0, usage[0], usage[1], self._cost(usage) if any(usage) else 0.0))
            raise

    def worst_cost(self, prompt_tokens: int, completion_limit: int) -> float:
        """The most one attempt can cost: ``prompt_tokens`` (its body's estimate, an upper bound:
        :func:`~recall_tasks.judges.tokens.request_tokens`) plus the completion limit, at the model's price; 0.0
        for a model of no known price."""
        return self._cost([prompt_tokens, completion_limit]) or 0.0

    def least_worst_cost(self) -> tuple[float, int, int]:
        """The worst case of the smallest request this judge sends (one empty statement, no context, no reasons):
        (USD, prompt tokens at most, completion limit). A cost cap below it could pay for no request at all."""
        request = JudgeRequest(task="contextual_recall", question="", statements=[""], evidence=[])
        request.include_reason = False
        prompt, limit = tokens.request_tokens(self.batch_body(request))
        return self.worst_cost(prompt, limit), prompt, limit

    def _cost(self, usage: list[int], factor: float = 1.0) -> float | None:
        price = price_for(self._model, self.prices)
        return None if price is None else factor * (usage[0] * price[0] + usage[1] * price[1]) / 1e6

    def _request_kwargs(
        self, msgs: list[dict[str, str]], budget: int, schema: tuple[str, dict[str, Any]] = wire.VERDICTS
    ) -> dict[str, Any]:
        """The request body (:func:`~recall_tasks.judges._openai_wire.request_body`) in this judge's format."""
        return wire.request_body(
            self._model, msgs, budget, max_tokens_param=self.max_tokens_param, temperature=self.temperature,
            response_format=self._format, schema=schema,
        )  # fmt: skip

    async def _complete(
        self,
        state: _LoopState,
        msgs: list[dict[str, str]],
        budget: int,
        usage: list[int],
        schema: tuple[str, dict[str, Any]] = wire.VERDICTS,
        models: list[str] | None = None,
    ) -> str:
        """One logical completion: format fallback, one retry on truncation; returns the content (the models its
        replies named are added to ``models``)."""
        truncated_once = False
        while True:
            if state.rpm:
                await state.rpm.acquire(1)
            body = self._request_kwargs(msgs, budget, schema)
            gate = attempt_gate.get()
            # one estimate for --tpm and the cost cap: the body's prompt tokens at most plus its completion limit
            need = tokens.request_tokens(body) if state.tpm or (gate is not None and gate.reserves_cost) else (0, 0)
            charged = sum(need)
            sent = await state.tpm.acquire(charged) if state.tpm else None
            if gate is not None:  # each attempt of this completion reserves its worst case before it is sent
                gate.arm(self.worst_cost(*need))
            before = list(usage)
            try:
                try:
                    reply = await post_chat(state.client, body)
                except openai.BadRequestError as exc:
                    if self._format != "none" and "response_format" in _error_text(exc):
                        fallback = wire.FORMATS[wire.FORMATS.index(self._format) + 1]
                        log.warning("endpoint rejected response_format=%s; falling back to %s", self._format, fallback)
                        self._format = fallback
                        continue
                    raise self._translate(exc) from None
                except openai.OpenAIError as exc:
                    raise self._translate(exc) from None
                content, finish_reason = wire.read_completion(reply, self._model, usage, models)
            finally:
                if gate is not None:  # what the replies did not use goes back (a failed attempt: all of it)
                    gate.settle(self._cost([usage[0] - before[0], usage[1] - before[1]]) or 0.0)
                if state.tpm is not None and sent is not None:  # --tpm: likewise
                    state.tpm.give_back(sent, charged - (usage[0] - before[0]) - (usage[1] - before[1]))
            if finish_reason == "length":
                if truncated_once:
                    raise JudgeResponseError(
                        f"judge {self._model} output was truncated twice (limit {budget} tokens)",
                        model=self._model,
                    )
                truncated_once = True
                budget *= 2
                continue
            return content

    def _translate(self, exc: Exception) -> Exception:
        """Map SDK errors to recall-bench's typed errors with a message that says what to fix."""
        return translate_error(exc, self.endpoint, self._model, self._api_key, self.max_retries, self.timeout_s)


if TYPE_CHECKING:

    def _conforms(judge: OpenAIJudge) -> FullJudge:
        """mypy: the judge has every capability the pipeline checks for (a renamed one is a type error here)."""
        return judge
