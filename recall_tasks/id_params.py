"""The run parameters of the id-based retrieval metrics (issue 41): cut-offs, chunk-to-document pattern, qrels,
the verdict metric. A base of :class:`recall_tasks.config.RunParams` (every field is a CLI option and a deployment
parameter); what they mean is in docs/usage.md, "Id-based retrieval metrics"."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import re2
from pydantic import BaseModel, Field, field_validator, model_validator

ID_METRIC_NAMES = ("recall", "precision", "hit_rate", "mrr", "ndcg")

#: The name :func:`compile_id_pattern` gives the pattern's group for Arrow's kernel (``pc.extract_regex``).
GROUP = "doc"
_SHOWN = 100  # characters of a refused pattern quoted in its error

#: RE2's complaint -> the construct it means (the ones Python's ``re`` has and linear-time matching has not).
_CONSTRUCTS = {
    "invalid perl operator: (?=": "lookahead (?=...)",
    "invalid perl operator: (?!": "negative lookahead (?!...)",
    "invalid perl operator: (?<=": "lookbehind (?<=...)",
    "invalid perl operator: (?<!": "negative lookbehind (?<!...)",
    "invalid perl operator: (?>": "atomic group (?>...)",
    "invalid perl operator: (?(": "conditional group (?(...)",
    "invalid perl operator: (?#": "comment (?#...)",
    "invalid escape sequence: \\Z": "\\Z (write \\z for the end of the id)",
    "invalid escape sequence: \\k": "backreference \\k<name>",
    "invalid escape sequence: \\u": "escape \\u (write \\x{...})",
    "invalid escape sequence: \\U": "escape \\U (write \\x{...})",
    "invalid escape sequence: \\N": "escape \\N{...} (write \\x{...})",
}


@dataclass(frozen=True)
class IdPattern:
    """``--id-pattern`` checked (:func:`compile_id_pattern`): RE2 syntax, exactly one group. Plain text, so a run's
    setup pickles; matched in linear time in the id's length, whatever the pattern.

    The document id of a chunk id is what the group captured in the first match anywhere in it (``re.search``);
    RE2's ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII (as Python's with ``re.ASCII``), ``$`` is the end of
    the id only (Python's also matches before a final newline).
    """

    pattern: str  # as given
    kernel: str | None  # the same pattern with its group named GROUP, for pc.extract_regex; None: match one by one

    def search(self, chunk: str) -> str | None:
        """What the group captured in the first match in ``chunk`` (None: no match, or the group took no part)."""
        found = _compiled(self.pattern).search(chunk)
        captured = found.group(1) if found is not None else None
        return str(captured) if captured is not None else None

    def one_by_one(self) -> IdPattern:
        """This pattern matched id by id with the RE2 binding (what a pattern Arrow's kernel refuses gets)."""
        return IdPattern(self.pattern, None)


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the binding's C++ logger would write each refused pattern to stderr
    return options


@functools.lru_cache(maxsize=16)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern, _options())


def _shown(pattern: str) -> str:
    return repr(pattern) if len(pattern) <= _SHOWN else f"{pattern[:_SHOWN]!r}..."


def _construct(complaint: str, pattern: str) -> str | None:
    """The construct RE2 refused, in Python's words (None: not one of those, the pattern is just wrong)."""
    for start, construct in _CONSTRUCTS.items():
        if complaint.startswith(start):
            return construct
    if complaint.startswith("invalid escape sequence: \\") and complaint[-1:].isdigit():
        return f"backreference {complaint.rpartition(' ')[2]}"
    if complaint.startswith("invalid perl operator: (?P") and "(?P=" in pattern:
        return "backreference (?P=name)"
    if complaint.startswith("bad repetition operator: ") and complaint.endswith("+"):
        return f"possessive quantifier {complaint.rpartition(' ')[2]}"
    if complaint[:-1] == "invalid perl operator: (?" and complaint[-1] in "aLux":
        return f"the inline flag {complaint[-1]} (RE2 has i, m, s and U)"
    return None


def _named(pattern: str) -> str | None:
    """``pattern`` with its one capturing group named :data:`GROUP` (Arrow's kernel takes named groups only),
    found by a scan of RE2's syntax (escapes, ``\\Q...\\E``, classes); checked by RE2, None if it is not that."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern.startswith("\\Q", i):
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
            else:
                i += 2
        elif c == "[":
            i += 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)  # a ] first in a class is itself
            while i < n and pattern[i] != "]":
                if pattern.startswith("[:", i):
                    end = pattern.find(":]", i + 2)
                    i = i + 1 if end < 0 else end + 2
                else:
                    i += 2 if pattern[i] == "\\" else 1
            i += 1
        elif c == "(" and not pattern.startswith("(?", i):
            head = i + 1
            break
        elif pattern.startswith(("(?P<", "(?<"), i) and not pattern.startswith(("(?<=", "(?<!"), i):
            end = pattern.find(">", i)
            if end < 0:
                return None
            head = end + 1
            break
        else:
            i += 1
    else:
        return None
    named = f"{pattern[:i]}(?P<{GROUP}>{pattern[head:]}"
    try:
        regex = _compiled(named)
    except re2.error:
        return None
    return named if regex.groups == 1 and dict(regex.groupindex) == {GROUP: 1} else None


def compile_id_pattern(pattern: str) -> IdPattern:
    """``--id-pattern`` checked: RE2 syntax (linear-time matching), exactly one group. A ValueError naming the
    option and why otherwise: the construct RE2 lacks (a backreference, lookaround...), RE2's complaint, or the
    number of groups."""
    try:
        regex = _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else ""
        complaint = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        construct = _construct(complaint, pattern)
        if construct is not None:
            raise ValueError(
                f"--id-pattern {_shown(pattern)} uses a construct linear-time matching does not support "
                f"({construct}); the pattern is matched with RE2's syntax"
            ) from None
        raise ValueError(
            f"--id-pattern {_shown(pattern)} is not a regular expression linear-time matching (RE2) accepts: "
            f"{complaint[:_SHOWN]}"
        ) from None
    groups = int(regex.groups)
    if groups != 1:
        raise ValueError(
            f"--id-pattern {_shown(pattern)} must have exactly one group (the document id), it has {groups}"
        )
    return IdPattern(pattern, _named(pattern))


class IdParams(BaseModel):
    """The id metrics' parameters (all optional: a run whose dataset has no id columns ignores them)."""

    k: str = Field(
        "1,5,10",
        pattern=r"^\s*\d+(\s*,\s*\d+)*\s*$",
        description="Cut-offs of the id metrics (recall@k, precision@k, hit_rate@k, mrr@k, ndcg@k), comma-separated",
    )
    id_pattern: str | None = Field(
        None,
        description="Regex with one group: a chunk id's document id (e.g. '^(.+)::'), applied before the id metrics "
        "(RE2 syntax, matched in linear time: no backreferences or lookaround)",
    )
    qrels_uri: str | None = Field(
        None,
        description="Relevant document ids per row: Parquet (query_id, doc_id[, relevance]) or TREC qrels text "
        "(query_id 0 doc_id relevance), joined to the rows by row id",
    )
    verdict_metric: str = Field(
        "recall@10",
        pattern=r"^(recall|precision|hit_rate|mrr|ndcg)@[1-9][0-9]*$",
        description="The id metric deciding a retrieval_ids run's verdict (its k must be one of --k)",
    )

    @field_validator("id_pattern")
    @classmethod
    def _one_group(cls, value: str | None) -> str | None:
        if value is not None:
            compile_id_pattern(value)
        return value

    @model_validator(mode="after")
    def _retrieval_ids_options(self) -> Any:
        """A ``retrieval_ids`` run has no judge: the options that need one are refused, never ignored."""
        if getattr(self, "metric", None) != "retrieval_ids":
            return self
        for name, option in (("batch", "--batch"), ("canary", "--canary")):
            if getattr(self, name, None):
                raise ValueError(f"{option} needs a judge and --metric retrieval_ids has none")
        if getattr(self, "units", "sentences") != "sentences":
            raise ValueError("--units claims needs a judge and --metric retrieval_ids has none")
        return self
