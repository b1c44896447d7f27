"""Contextual recall: which sentences of the expected output the retrieval context supports."""

from __future__ import annotations

from typing import ClassVar

from recall_tasks.judges.base import JudgeRequest, Task
from recall_tasks.metrics.base import Metric, Missing, Prepared
from recall_tasks.models import RecallCase
from recall_tasks.sentences import split_sentences


class ContextualRecall(Metric):
    """score = supported sentences / sentences × scale; sentences are split in code, not by the judge.

    Required: ``expected_output`` (with at least one sentence) and a non-empty retrieval context.
    ``input`` is optional: the judge only uses it to resolve references such as "he" or "it".
    """

    task: ClassVar[Task] = "contextual_recall"
    display_name: ClassVar[str] = "Contextual Recall"
    unit: ClassVar[str] = "sentence"
    evidence_unit: ClassVar[str] = "chunk"

    def prepare(self, case: RecallCase, context: list[str] | None) -> Prepared | Missing:
        if not context or not any(c and c.strip() for c in context):
            return Missing("retrieval_context")
        sentences = split_sentences(case.expected_output or "")
        if not sentences:
            return Missing("expected_output")
        request = JudgeRequest(
            task=self.task,
            question=case.input or "",
            statements=sentences,
            evidence=context,
            include_reason=self.include_reason,
        )
        return Prepared(request=request, sentence_count=len(sentences), context_count=len(context))
