"""The OpenAI judge's wire format: the chat-completions body it sends, the reply it reads, the repair it asks for.

Split from :mod:`recall_tasks.judges.openai_judge` (the judge: clients per loop, limits, costs, the Batch API,
claims), which posts the bodies built here and hands the replies to these functions; HTTP (clients, failed
attempts, SDK errors) is :mod:`recall_tasks.judges._openai_http` and the modules it names.

- ``response_format`` is one of :data:`FORMATS`, in fallback order: JSON schema (strict), JSON mode, none.
- A reply body is read tolerantly (:func:`read_completion`); an unusable verdict reply gets one repair request
  (:func:`parse_or_repair`), live and for a batch line alike.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from recall_tasks.errors import JudgeResponseError
from recall_tasks.judges import prompts
from recall_tasks.judges._json import constant, loads
from recall_tasks.judges.base import JudgeRequest, JudgeResponse
from recall_tasks.judges.parsing import ParseError, parse_verdicts

log = logging.getLogger(__name__)

#: ``response_format`` values, in the order the judge falls back when an endpoint rejects one.
FORMATS = ("json_schema", "json_object", "none")
#: (name, JSON schema) of the strict ``response_format`` for verdicts and for claims.
VERDICTS = ("recall_verdicts", constant(prompts.RESPONSE_SCHEMA))
CLAIMS = ("recall_claims", constant(prompts.CLAIMS_SCHEMA))

#: What :func:`parse_or_repair` returns: the verdicts, the summary and the flags of a parsed reply.
Parsed = tuple[list[Any], str, list[str]]


def verdict_budget(request: JudgeRequest) -> int:
    """Completion tokens asked for a verdict request (doubled once on truncation)."""
    return 64 + len(request.statements) * (48 if request.include_reason else 24)


def request_body(
    model: str,
    msgs: list[dict[str, str]],
    budget: int,
    *,
    max_tokens_param: str,
    temperature: float | None,
    response_format: str,
    schema: tuple[str, dict[str, Any]] = VERDICTS,
) -> dict[str, Any]:
    """The ``/chat/completions`` body: ``budget`` under ``max_tokens_param``, ``schema`` for ``json_schema``."""
    kwargs: dict[str, Any] = {"model": model, "messages": msgs, max_tokens_param: budget}
    if temperature is not None:
        kwargs["temperature"] = temperature
    if response_format == "json_schema":
        kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": schema[0], "strict": True, "schema": schema[1]},
        }
    elif response_format == "json_object":
        kwargs["response_format"] = {"type": "json_object"}
    return kwargs


def read_completion(
    raw: bytes, model: str, usage: list[int], models: list[str] | None = None
) -> tuple[str, str | None]:
    """The content and finish reason of a chat-completion body; its token counts are added to ``usage``, the model
    it names to ``models``."""
    try:
        reply = loads(raw)
        if models is not None and isinstance(reply.get("model"), str) and reply["model"]:
            models.append(reply["model"])
        usage_data = reply.get("usage") or {}
        usage[0] += int(usage_data.get("prompt_tokens") or 0)
        usage[1] += int(usage_data.get("completion_tokens") or 0)
        choice = reply["choices"][0]
        content = (choice.get("message") or {}).get("content") or ""
        finish_reason = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise JudgeResponseError(
            f"judge {model} returned a body that is not a chat completion: {raw.decode('utf-8', 'replace')[:200]!r}",
            model=model,
        ) from None
    return content, finish_reason


async def parse_or_repair(
    request: JudgeRequest,
    msgs: list[dict[str, str]],
    content: str,
    model: str,
    complete: Callable[[list[dict[str, str]]], Awaitable[str]],
) -> Parsed:
    """Parse a reply; an unusable one gets one repair request, sent with ``complete`` (the conversation so far,
    the reply, what was wrong with it). The judge's and the batch collection's rule."""
    try:
        return parse_verdicts(content, len(request.statements), len(request.evidence))
    except ParseError as first:
        log.info("judge reply unusable (%s); sending one repair request", first)
        repair = [
            *msgs,
            {"role": "assistant", "content": content[:4000]},
            {"role": "user", "content": prompts.repair_prompt(str(first), len(request.statements))},
        ]
        content = await complete(repair)
        try:
            verdicts, summary, flags = parse_verdicts(content, len(request.statements), len(request.evidence))
        except ParseError as second:
            raise JudgeResponseError(
                f"judge {model} gave an unusable reply twice (after one repair request): {second}",
                model=model,
            ) from None
        return verdicts, summary, ["repaired after an unusable first reply", *flags]


def verdict_response(
    request: JudgeRequest,
    parsed: Parsed,
    usage: list[int],
    requests: int,
    cost: float | None,
    *,
    model: str,
    prompt_version: str,
    replied: tuple[str | None, bool] = (None, False),
) -> JudgeResponse:
    """The :class:`JudgeResponse` of a parsed reply (reasons and summary dropped unless the request asked);
    ``replied``: the model the reply named and whether it is another than ``model``."""
    verdicts, summary, flags = parsed
    if not request.include_reason:
        verdicts = [v.model_copy(update={"reason": ""}) for v in verdicts]
        summary = ""
    return JudgeResponse(
        verdicts=verdicts,
        summary=summary,
        model=model,
        prompt_version=prompt_version,
        prompt_tokens=usage[0],
        completion_tokens=usage[1],
        cost_usd=cost,
        requests=requests,
        flags=flags,
        reply_model=replied[0],
        substituted=replied[1],
    )
