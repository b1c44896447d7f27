"""A judge for the fake OpenAI server that answers from human labels, wrong on a known, deterministic share of units.

``LabelJudge(labelled_set, flip_rate)`` is a responder (``fake_openai.set_responder(LabelJudge(...))``): for a
judge request whose statements are a labelled row's units it answers each unit with the human label, except
the units chosen to be flipped, answered with the opposite verdict (reason ``"flipped"``).

Which units flip: every unit of the set gets a place in a stable order (sha256 of ``salt``, the row key, the
unit's index and text), and the unit at place p flips when floor((p + 1) × rate) > floor(p × rate): exactly
floor(N × rate) of the N units, evenly spread over that order (rate 0.2: places 4, 9, 14...: every 5th unit).
So the judge's accuracy is known before any request: :meth:`LabelJudge.expected_rows` gives the verdicts it
will answer as ``PairedRow`` s, and ``agreement(judge.expected_rows())`` the exact figures ``calibrate`` must report.
Independent of arrival order, concurrency and retries. A different ``salt`` flips a different set of units.

A row labelled only by ``expected_score`` is answered "supported" for its first round(score × units) units.
Requests that match no labelled row are answered by ``fallback`` (default: tests/judge_script.py's responder),
so a run with a canary set and ordinary rows works with one responder.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from recall_tasks.analysis.agreement import PairedRow
from recall_tasks.io.labels import LabelledRow, LabelledSet
from recall_tasks.judges.prompts import _fence
from recall_tasks.sentences import split_sentences
from tests.judge_script import parse_prompt
from tests.judge_script import responder as word_responder

Key = tuple[str, tuple[str, ...], tuple[str, ...]]


def _prompt_key(row: LabelledRow) -> Key:
    """(task, statements, evidence) as :func:`tests.judge_script.parse_prompt` reads them from the prompt."""
    context = [c if c is not None else "" for c in row.row["retrieval_context"] or []]
    if row.task == "contextual_recall":
        return row.task, tuple(row.units or []), tuple(_fence(c) for c in context)
    answer = split_sentences(row.row["actual_output"] or "")
    return row.task, tuple(_fence(c) for c in context), tuple(answer)


def _human(row: LabelledRow) -> list[bool]:
    if row.labels is not None:
        return list(row.labels)
    n = len(row.units or [])
    yes = round((row.expected_score or 0.0) * n)
    return [k < yes for k in range(n)]


class LabelJudge:
    """A responder answering from labels with a known flip rate (see the module docstring)."""

    def __init__(
        self,
        labelled: LabelledSet | Iterable[LabelledRow],
        flip_rate: float = 0.0,
        salt: str = "",
        fallback: Callable[[dict[str, Any]], str] | None = word_responder,
    ) -> None:
        if not 0.0 <= flip_rate <= 1.0:
            raise ValueError(f"flip_rate must be in 0..1, got {flip_rate}")
        self.rows = list(labelled.rows if isinstance(labelled, LabelledSet) else labelled)
        self.flip_rate = flip_rate
        self.fallback = fallback
        places = sorted(
            ((hashlib.sha256(f"{salt}|{r.key}|{k}|{u}".encode()).hexdigest(), i, k)
             for i, r in enumerate(self.rows) for k, u in enumerate(r.units or []))
        )  # fmt: skip
        self.flipped: set[tuple[int, int]] = {
            (i, k)
            for p, (_, i, k) in enumerate(places)
            if math.floor((p + 1) * flip_rate + 1e-9) > math.floor(p * flip_rate + 1e-9)
        }
        self.answers: list[list[bool]] = [
            [v != ((i, k) in self.flipped) for k, v in enumerate(_human(r))] for i, r in enumerate(self.rows)
        ]
        self._by_key: dict[Key, int] = {}
        for i, r in enumerate(self.rows):
            self._by_key.setdefault(_prompt_key(r), i)

    @property
    def units(self) -> int:
        return sum(len(a) for a in self.answers)

    def expected_rows(self) -> list[PairedRow]:
        """What ``calibrate`` must pair: human labels and this judge's answers, per row (keys and categories kept)."""
        return [
            PairedRow(
                r.labels or [],
                self.answers[i] if r.labels is not None else [],
                category=r.category,
                human_score=r.expected_score,
                judge_score=None if r.labels is not None else _share(self.answers[i]),
                key=r.key,
            )
            for i, r in enumerate(self.rows)
        ]

    def __call__(self, body: dict[str, Any]) -> str:
        task, statements, evidence = parse_prompt(body)
        i = self._by_key.get((task, tuple(statements), tuple(evidence)))
        if i is None:
            if self.fallback is None:
                raise AssertionError(f"no labelled row for the request deciding {statements!r}")
            return self.fallback(body)
        verdicts = [
            {
                "id": k,
                "chunk_ids": [1] if yes else [],
                "reason": "flipped" if (i, k - 1) in self.flipped else "as labelled",
                "verdict": "yes" if yes else "no",
            }
            for k, yes in enumerate(self.answers[i], 1)
        ]
        return json.dumps({"verdicts": verdicts, "summary": ""})


def _share(answers: list[bool]) -> float | None:
    return sum(answers) / len(answers) if answers else None
