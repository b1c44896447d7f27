"""A scripted judge for the fake OpenAI server: reads our own prompt back and decides by word inclusion.

Rule (the "truth" the pipeline tests compare against): a statement is supported when every word of 4+
letters in it appears in one chunk (recall) / when the item shares a 4+-letter word with the answer
(coverage). It parses the prompt the way a model would see it, so a change to the prompt's numbering or
fencing breaks these tests.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.fake_openai import extract_user_text

_WORD = re.compile(r"[A-Za-z]{4,}")
_NUMBERED = re.compile(r'^(\d+)\. (".*")$')
_CHUNK = re.compile(r'<chunk id="(\d+)">\n(.*?)\n</chunk>', re.S)


def parse_prompt(body: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """(task, statements, evidence) as numbered in the user message."""
    text = extract_user_text(body, roles=("user",))
    quoted = [json.loads(m.group(2)) for line in text.splitlines() if (m := _NUMBERED.match(line))]
    chunks = [c for _, c in _CHUNK.findall(text)]
    if "Context items to decide" in text:
        return "context_coverage", chunks, quoted
    return "contextual_recall", quoted, chunks


def words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def truth(task: str, statements: list[str], evidence: list[str]) -> list[tuple[str, list[int]]]:
    out = []
    for s in statements:
        ws = words(s)
        if task == "contextual_recall":
            ids = [i for i, c in enumerate(evidence, 1) if ws and ws <= words(c)]
        else:
            ids = [i for i, c in enumerate(evidence, 1) if ws & words(c)]
        out.append(("yes" if ids else "no", ids[:1]))
    return out


def expected_score(task: str, statements: list[str], evidence: list[str]) -> float:
    verdicts = truth(task, statements, evidence)
    return sum(v == "yes" for v, _ in verdicts) / len(verdicts)


def responder(body: dict[str, Any]) -> str:
    """Answer a judge request correctly under the rule above."""
    task, statements, evidence = parse_prompt(body)
    verdicts = [
        {"id": i, "chunk_ids": ids, "reason": "found" if v == "yes" else "not in context", "verdict": v}
        for i, (v, ids) in enumerate(truth(task, statements, evidence), 1)
    ]
    return json.dumps({"verdicts": verdicts, "summary": ""})
