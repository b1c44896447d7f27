"""Retrievers used by the run-time retrieval tests: an in-memory "index" keyed by the question."""

from __future__ import annotations

INDEX: dict[str, list[str]] = {}
CALLS: list[int] = []


def retrieve(questions: list[str]) -> list[list[str]]:
    CALLS.append(len(questions))
    return [INDEX.get(q, []) for q in questions]


async def aretrieve(questions: list[str]) -> list[list[str]]:
    return retrieve(questions)


def broken(questions: list[str]) -> list[list[str]]:
    return [["only one"]]


def crashes(questions: list[str]) -> list[list[str]]:
    raise RuntimeError("index service unavailable")
