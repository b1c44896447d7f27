"""Contextual recall: which units of the expected output the retrieval context supports.

Units are the reference's sentences, split in code (the default), or its atomic claims (``units="claims"``,
Mastra's way: an extractor lists them once per distinct reference, see :mod:`recall_tasks.metrics.claims`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from recall_tasks.errors import ConfigError
from recall_tasks.judges.base import JudgeRequest, Task
from recall_tasks.judges.claims import ClaimExtractor
from recall_tasks.metrics.base import Metric, Missing, Prepared
from recall_tasks.metrics.claims import ClaimStore, ClaimUnits, Guard, Units
from recall_tasks.models import RecallCase
from recall_tasks.sentences import split_sentences

UnitKind = Literal["sentences", "claims"]


class ContextualRecall(Metric):
    """score = supported units / units × scale; the judge never decides how many units a row has.

    Required: ``expected_output`` (with at least one sentence) and a non-empty retrieval context.
    ``input`` is optional: the judge only uses it to resolve references such as "he" or "it".

    ``units="claims"``: the units are the claims ``claim_extractor`` (default: the judge, when it can extract,
    e.g. :class:`~recall_tasks.judges.openai_judge.OpenAIJudge`) finds in the reference; ``claim_store`` keeps
    them between runs (default: in memory for this metric's life).
    """

    task: ClassVar[Task] = "contextual_recall"
    display_name: ClassVar[str] = "Contextual Recall"
    unit: ClassVar[str] = "sentence"
    evidence_unit: ClassVar[str] = "chunk"

    def __init__(
        self,
        *args: Any,
        units: UnitKind = "sentences",
        claim_extractor: ClaimExtractor | None = None,
        claim_store: ClaimStore | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if units not in ("sentences", "claims"):
            raise ValueError(f"units must be 'sentences' or 'claims', got {units!r}")
        self.units: UnitKind = units
        self.claim_units: ClaimUnits | None = None
        if units == "claims":
            extractor = claim_extractor
            if extractor is None and isinstance(self.judge, ClaimExtractor):
                extractor = self.judge
            if extractor is None:
                raise ConfigError(
                    f"units='claims' needs a claim extractor: the {self.judge.model} judge cannot extract claims "
                    "(pass claim_extractor=OpenAIJudge(...), or use units='sentences')"
                )
            self.claim_units = ClaimUnits(extractor, claim_store)
            self.unit = "claim"  # type: ignore[misc]  # the reason's wording: "2 of 3 claims are not supported"

    async def resolve_units(
        self, cases: list[RecallCase], contexts: list[list[str] | None], guard: Guard | None = None
    ) -> list[Units | BaseException | None]:
        if self.claim_units is None:
            return [None] * len(cases)
        # rows that will be "missing" anyway (no context, no sentence) pay no extraction
        refs = [
            case.expected_output
            if case.expected_output and has_context(ctx) and split_sentences(case.expected_output)
            else None
            for case, ctx in zip(cases, contexts, strict=True)
        ]
        wanted = [r for r in refs if r is not None]
        found = await self.claim_units.units_for(wanted, guard) if wanted else {}
        out: list[Units | BaseException | None] = []
        charged: set[str] = set()
        for ref in refs:
            if ref is None:
                out.append(None)
                continue
            units = found[ref]
            if isinstance(units, Units) and ref in charged:
                units = units.free()  # the first row with this reference pays for its extraction
            charged.add(ref)
            out.append(units)
        return out

    def prepare(self, case: RecallCase, context: list[str] | None, units: Units | None = None) -> Prepared | Missing:
        if not has_context(context):
            return Missing("retrieval_context")
        assert context is not None
        statements = units.statements if units is not None else split_sentences(case.expected_output or "")
        if not statements:
            return Missing("expected_output")
        request = JudgeRequest(
            task=self.task,
            question=case.input or "",
            statements=statements,
            evidence=context,
            include_reason=self.include_reason,
        )
        return Prepared(request=request, sentence_count=len(statements), context_count=len(context), units=units)


def has_context(context: list[str] | None) -> bool:
    """Whether a row has a context to judge against (a row without pays no claim extraction)."""
    return bool(context) and any(c and c.strip() for c in context or [])
