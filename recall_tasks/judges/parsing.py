"""Turning a judge's raw reply into validated verdicts.

Order of tolerance: strict JSON; then a tolerant pass (code fences stripped, first ``{`` to last ``}``,
trailing commas removed); the result is validated with pydantic. Verdict labels are normalised
("Yes", "true", "1" -> yes). Unknown and duplicate ids are ignored; missing ids become "no" and are flagged.
Anything else (not an object, no ``verdicts`` list, an unrecognisable label) is a :class:`ParseError`,
which the judge answers with one repair request.

Replies are size-bounded before they are stored: a verdict's reason is cut at :data:`MAX_REASON_CHARS`, the
summary at :data:`MAX_SUMMARY_CHARS` (each cut flagged), and at most :data:`MAX_FLAGS` flags are kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from recall_tasks.judges._json import loads
from recall_tasks.judges.base import JudgeVerdict

#: A verdict's reason and the summary are cut here (a judge's reply is stored with every row).
MAX_REASON_CHARS = 2_000
MAX_SUMMARY_CHARS = 4_000
MAX_FLAGS = 20

_YES = {"yes", "y", "true", "1", "supported", "attributed"}
_NO = {"no", "n", "false", "0", "unsupported", "not supported", "not attributed", "idk"}
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


class ParseError(ValueError):
    """The reply cannot be turned into verdicts."""


class _RawVerdict(BaseModel):
    id: int
    verdict: str
    reason: str = ""
    chunk_ids: list[int] = Field(default_factory=list)

    @field_validator("verdict", mode="before")
    @classmethod
    def _label(cls, value: Any) -> str:
        text = str(value).strip().lower() if not isinstance(value, bool) else str(value).lower()
        if text in _YES:
            return "yes"
        if text in _NO:
            return "no"
        raise ValueError(f"verdict must be 'yes' or 'no', got {value!r}")

    @field_validator("reason", mode="before")
    @classmethod
    def _reason(cls, value: Any) -> str:
        return "" if value is None else str(value)

    @field_validator("chunk_ids", mode="before")
    @classmethod
    def _chunks(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, int | str):
            value = [value]
        return value


class _RawReply(BaseModel):
    verdicts: list[_RawVerdict]
    summary: str = ""

    @field_validator("summary", mode="before")
    @classmethod
    def _summary(cls, value: Any) -> str:
        return "" if value is None else str(value)


def load_json(text: str) -> Any:
    """Strict JSON first, then the tolerant pass; raises ParseError."""
    try:
        return loads(text)
    except (json.JSONDecodeError, TypeError):
        pass
    body = _FENCE.sub("", (text or "").strip())
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        raise ParseError("reply is not JSON (no object found)")
    candidate = _TRAILING_COMMA.sub(r"\1", body[start : end + 1])
    try:
        return json.loads(candidate)
    except json.JSONDecodeError as exc:
        raise ParseError(f"reply is not valid JSON ({exc.msg} at char {exc.pos})") from None


def parse_verdicts(text: str, count: int, evidence_count: int) -> tuple[list[JudgeVerdict], str, list[str]]:
    """Parse a reply for ``count`` statements; returns verdicts (ids 1..count in order), summary, flags."""
    data = load_json(text)
    if isinstance(data, list):
        data = {"verdicts": data}
    if not isinstance(data, dict):
        raise ParseError(f"reply must be a JSON object, got {type(data).__name__}")
    try:
        reply = _RawReply.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ParseError(f"reply does not match the schema: {where}: {first['msg']}") from None
    flags: list[str] = []
    by_id: dict[int, _RawVerdict] = {}
    for raw in reply.verdicts:
        if not 1 <= raw.id <= count:
            flags.append(f"ignored verdict for unknown id {raw.id}")
        elif raw.id in by_id:
            flags.append(f"ignored duplicate verdict for id {raw.id}")
        else:
            by_id[raw.id] = raw
    if count and not by_id:
        raise ParseError(f"reply has no usable verdict for any of the {count} ids")
    verdicts: list[JudgeVerdict] = []
    cuts: list[str] = []
    for i in range(1, count + 1):
        raw_v = by_id.get(i)
        if raw_v is None:
            flags.append(f"id {i} missing from judge output, counted as no")
            verdicts.append(
                JudgeVerdict(
                    id=i,
                    verdict="no",
                    reason="missing from judge output",
                    flagged="missing from judge output",
                )
            )
            continue
        chunks = sorted({c for c in raw_v.chunk_ids if 1 <= c <= evidence_count})
        reason = raw_v.reason
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "…"
            cuts.append(f"reason of id {i} truncated to {MAX_REASON_CHARS} characters")
        verdicts.append(
            JudgeVerdict(id=i, verdict="yes" if raw_v.verdict == "yes" else "no", reason=reason, chunk_ids=chunks)
        )
    summary = reply.summary
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[:MAX_SUMMARY_CHARS] + "…"
        cuts.append(f"summary truncated to {MAX_SUMMARY_CHARS} characters")
    flags = cuts + flags  # the cuts first: they survive the bound below
    if len(flags) > MAX_FLAGS:
        flags = [*flags[: MAX_FLAGS - 1], f"and {len(flags) - MAX_FLAGS + 1} more flags"]
    return verdicts, summary, flags


#: A claim longer than this is cut (a claim is one fact; a reply is stored with every row).
MAX_CLAIM_CHARS = 1_000


def parse_claims(text: str) -> list[str]:
    """``{"claims": [string, ...]}`` (or a bare list) -> stripped, non-empty claims, exact duplicates dropped.

    Raises :class:`ParseError` when the reply is not JSON of that shape (an item that is not a string included).
    """
    data = load_json(text) if not text.lstrip().startswith("[") else _load_list(text)
    if isinstance(data, dict):
        data = data.get("claims")
    if not isinstance(data, list):
        raise ParseError('reply must be {"claims": [string, ...]}')
    out: list[str] = []
    for item in data:
        if not isinstance(item, str):
            raise ParseError(f"every claim must be a string, got {type(item).__name__}")
        claim = " ".join(item.split())[:MAX_CLAIM_CHARS]
        if claim and claim not in out:
            out.append(claim)
    return out


def _load_list(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"reply is not valid JSON ({exc.msg} at char {exc.pos})") from None
