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


# --------------------------------------------------------------------------------------- claim extraction

_REFERENCE = re.compile(r"^Reference answer: (\".*\")$", re.M)
_AND = re.compile(r",? and ")


def is_extraction(body: dict[str, Any]) -> bool:
    """A claim-extraction request (its JSON schema, or its system prompt when the format fell back)."""
    rf = body.get("response_format") or {}
    if (rf.get("json_schema") or {}).get("name") == "recall_claims":
        return True
    return extract_user_text(body, roles=("system",)).startswith("You split a reference answer")


def reference_of(body: dict[str, Any]) -> str:
    """The reference answer an extraction request quotes."""
    m = _REFERENCE.search(extract_user_text(body, roles=("user",)))
    assert m is not None, "no reference answer in the extraction request"
    return str(json.loads(m.group(1)))


def is_retry(body: dict[str, Any]) -> bool:
    return len(body.get("messages") or []) > 2


def split_claims(reference: str) -> list[str]:
    """A deterministic "extractor": each sentence cut at ' and ' / ', and ', the subject carried over.

    "Einstein was born in 1879 and developed relativity." -> ["Einstein was born in 1879.",
    "Einstein developed relativity."] (a clause starting lower-case gets the sentence's first word).
    """
    from recall_tasks import split_sentences

    claims = []
    for sentence in split_sentences(reference):
        body = sentence.rstrip(".!?")
        subject = body.split(" ", 1)[0]
        for k, clause in enumerate(_AND.split(body)):
            clause = clause.strip()
            if k and clause[:1].islower():
                clause = f"{subject} {clause}"
            claims.append(clause + ".")
    return claims


def claims_responder(extract: Any = None, judge: Any = None) -> Any:
    """A responder answering extractions with ``extract(reference, retry) -> list[str] | str`` (default: the
    deterministic :func:`split_claims`; a ``str`` is sent as the raw content) and judge requests with ``judge``
    (default: :func:`responder`)."""

    def answer(body: dict[str, Any]) -> str:
        if is_extraction(body):
            ref = reference_of(body)
            out = extract(ref, is_retry(body)) if extract is not None else split_claims(ref)
            return out if isinstance(out, str) else json.dumps({"claims": out})
        return (judge or responder)(body)

    return answer
