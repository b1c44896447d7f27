"""Context extractors used by the agent-trace tests (``--context-extractor tests.sample_traces:NAME``)."""

from __future__ import annotations

from typing import Any


def final_answer_sources(question: str | None, messages: list[dict[str, Any]]) -> list[str]:
    """The assistant's messages that are not tool calls (a shape tool-results cannot read)."""
    return [m["content"] for m in messages if m.get("role") == "assistant" and m.get("content")]


async def async_sources(question: str | None, messages: list[dict[str, Any]]) -> list[str]:
    return final_answer_sources(question, messages)


def crashes(question: str | None, messages: list[dict[str, Any]]) -> list[str]:
    raise KeyError("documents")


def wrong_type(question: str | None, messages: list[dict[str, Any]]) -> str:
    return "one string"


def one_argument(messages: list[dict[str, Any]]) -> list[str]:
    return []


NOT_CALLABLE = 3
