"""Versioned judge prompts and the response contract.

Prompt texts live as data in ``recall_tasks/prompts/<task>-<version>.system.txt``. The system message is
static per task and version, so providers' prompt caching applies to it; everything that varies per case
(question, numbered statements, fenced evidence) goes into the user message after it.

Bump ``PROMPT_VERSION`` whenever a template or the rendering below changes: it is part of every cache key
and recorded with every result.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from recall_tasks.judges._json import quote
from recall_tasks.judges.base import JudgeRequest

PROMPT_VERSION = "v1"
SCHEMA_VERSION = "verdicts-v1"
#: The claim extraction's prompt (``claims-<v>.system.txt``, ``claims-repair-<v>.txt``), schema and the checks its
#: claims pass (``metrics/claims.py``); part of the claims cache key. Bump it when any of them changes.
CLAIMS_PROMPT_VERSION = "claims-v1"

CLAIMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["claims"],
    "properties": {"claims": {"type": "array", "items": {"type": "string"}}},
}

RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["verdicts", "summary"],
    "properties": {
        "verdicts": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["id", "chunk_ids", "reason", "verdict"],
                "properties": {
                    "id": {"type": "integer"},
                    "chunk_ids": {"type": "array", "items": {"type": "integer"}},
                    "reason": {"type": "string"},
                    "verdict": {"type": "string", "enum": ["yes", "no"]},
                },
            },
        },
        "summary": {"type": "string"},
    },
}


@cache
def _template(name: str) -> str:
    return resources.files("recall_tasks").joinpath("prompts", name).read_text(encoding="utf-8").strip()


def system_prompt(task: str, version: str = PROMPT_VERSION) -> str:
    """The static instructions for ``task`` at ``version``."""
    return _template(f"{task}-{version}.system.txt")


def repair_prompt(error: str, count: int, version: str = PROMPT_VERSION) -> str:
    """The follow-up message asking the judge to fix an unusable reply."""
    return _template(f"repair-{version}.txt").format(error=error[:300], count=count)


def claims_messages(
    reference: str, version: str = CLAIMS_PROMPT_VERSION, previous: str | None = None, problem: str = "", limit: int = 0
) -> list[dict[str, str]]:
    """Chat messages of one claim extraction: static system message, the reference quoted as a JSON string.

    With ``previous`` (the retry): the previous reply and what was wrong with it follow.
    """
    msgs = [
        {"role": "system", "content": _template(f"{version}.system.txt")},
        {"role": "user", "content": f"Reference answer: {quote(reference)}"},
    ]
    if previous is not None:
        repair = _template(version.replace("claims-", "claims-repair-") + ".txt")
        msgs += [
            {"role": "assistant", "content": previous[:4000]},
            {"role": "user", "content": repair.format(problem=problem[:300], limit=limit)},
        ]
    return msgs


def _fence(text: str) -> str:
    # A chunk must not be able to close its own fence and speak as instructions.
    return text.replace("</chunk", "<\\/chunk").replace("</answer", "<\\/answer")


def user_prompt(request: JudgeRequest) -> str:
    """The per-case message: question, numbered statements quoted verbatim, numbered evidence fenced as data."""
    lines = [f"Question: {quote(request.question)}", ""]
    if request.task == "contextual_recall":
        lines.append(f"Sentences to decide ({len(request.statements)}):")
        lines += [f"{i}. {quote(s)}" for i, s in enumerate(request.statements, 1)]
        lines += ["", f"Context chunks ({len(request.evidence)}):"]
        lines += [f'<chunk id="{i}">\n{_fence(c)}\n</chunk>' for i, c in enumerate(request.evidence, 1)]
    else:
        lines.append(f"Context items to decide ({len(request.statements)}):")
        lines += [f'<chunk id="{i}">\n{_fence(c)}\n</chunk>' for i, c in enumerate(request.statements, 1)]
        lines += ["", f"Answer sentences ({len(request.evidence)}):", "<answer>"]
        lines += [f"{i}. {quote(s)}" for i, s in enumerate(request.evidence, 1)]
        lines.append("</answer>")
    if not request.include_reason:
        lines += ["", 'Leave every "reason" and the "summary" as "".']
    return "\n".join(lines)


def messages(request: JudgeRequest, version: str = PROMPT_VERSION) -> list[dict[str, str]]:
    """Chat messages for one case: static system message first, then the case."""
    return [
        {"role": "system", "content": system_prompt(request.task, version)},
        {"role": "user", "content": user_prompt(request)},
    ]
