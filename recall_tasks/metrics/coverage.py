"""Context coverage: which retrieval-context items the produced answer actually uses (Mastra's legacy metric)."""

from __future__ import annotations

from typing import ClassVar

from recall_tasks.judges.base import JudgeRequest, Task
from recall_tasks.metrics.base import Metric, Missing, Prepared
from recall_tasks.metrics.claims import Units
from recall_tasks.models import RecallCase
from recall_tasks.sentences import split_sentences


class ContextCoverage(Metric):
    """score = context items used by ``actual_output`` / context items × scale.

    Required: ``actual_output`` (with at least one sentence) and a non-empty retrieval context.
    Verdicts are per context item; their ``chunk_ids`` name the answer sentences that use the item.
    """

    task: ClassVar[Task] = "context_coverage"
    display_name: ClassVar[str] = "Context Coverage"
    unit: ClassVar[str] = "context item"
    evidence_unit: ClassVar[str] = "answer sentence"
    supported_word: ClassVar[str] = "used"

    def prepare(self, case: RecallCase, context: list[str] | None, units: Units | None = None) -> Prepared | Missing:
        if not context or not any(c and c.strip() for c in context):
            return Missing("retrieval_context")
        sentences = split_sentences(case.actual_output or "")
        if not sentences:
            return Missing("actual_output")
        request = JudgeRequest(
            task=self.task,
            question=case.input or "",
            statements=list(context),
            evidence=sentences,
            include_reason=self.include_reason,
        )
        return Prepared(request=request, sentence_count=len(sentences), context_count=len(context))
