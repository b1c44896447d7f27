"""What contextual recall and context coverage share: input policy, one judge call, score and reason in code.

A measurement has three steps, each a plain method so the pipeline can put its cache between them:
``prepare`` (validate inputs, split sentences, resolve context: no judge), the judge call, and
``finalize`` (score, success, reason: pure). ``a_measure`` chains them; ``measure`` runs ``a_measure``
through :func:`recall_tasks._sync.run_sync`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from recall_tasks._sync import run_sync
from recall_tasks.errors import MissingInputError
from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse, Task
from recall_tasks.metrics.claims import Guard, Units
from recall_tasks.metrics.precision import chunk_use
from recall_tasks.models import OnMissing, RecallCase, RecallResult, ResultMetadata, Verdict

ContextExtractor = Callable[[RecallCase], Sequence[str] | Awaitable[Sequence[str]]]


@dataclass(frozen=True)
class Prepared:
    """A case ready for the judge: the request, and counts the result reports.

    ``units``: the claims (or their fallback) when the units are not code-split sentences, with what
    extracting them cost and their flags; the result adds both.
    """

    request: JudgeRequest
    sentence_count: int
    context_count: int
    units: Units | None = None


@dataclass(frozen=True)
class Missing:
    """A case whose required field is missing or empty."""

    field: str


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Metric:
    """Base of the metrics; subclasses say which field they split and which way they judge."""

    task: ClassVar[Task]
    display_name: ClassVar[str]
    unit: ClassVar[str]
    evidence_unit: ClassVar[str]

    def __init__(
        self,
        judge: Judge | None = None,
        threshold: float = 0.5,
        scale: float = 1.0,
        include_reason: bool = True,
        strict_mode: bool = False,
        on_missing: OnMissing = "error",
        context: Sequence[str] | None = None,
        context_extractor: ContextExtractor | None = None,
    ) -> None:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        if not 0 <= threshold <= scale:
            raise ValueError(f"threshold must be between 0 and scale ({scale}), got {threshold}")
        if on_missing not in ("error", "zero", "skip"):
            raise ValueError(f"on_missing must be 'error', 'zero' or 'skip', got {on_missing!r}")
        if judge is None:
            from recall_tasks.judges.lexical import LexicalJudge

            judge = LexicalJudge()
        self.judge = judge
        self.threshold = threshold
        self.scale = scale
        self.include_reason = include_reason
        self.strict_mode = strict_mode
        self.on_missing: OnMissing = on_missing
        self.context = list(context) if context is not None else None
        self.context_extractor = context_extractor

    # -- the three steps -------------------------------------------------------------------------

    async def resolve_context(self, case: RecallCase) -> list[str] | None:
        """The extractor if given, else the case's own context, else the metric's static context."""
        if self.context_extractor is not None:
            out = self.context_extractor(case)
            if inspect.isawaitable(out):
                out = await out
            return list(out)
        if case.retrieval_context is not None:
            return list(case.retrieval_context)
        return self.context

    async def resolve_units(
        self, cases: list[RecallCase], contexts: list[list[str] | None], guard: Guard | None = None
    ) -> list[Units | BaseException | None]:
        """The units of each case when they are not code-split sentences (claims), else None.

        Called once per batch so that extractions run concurrently; a case whose extraction failed gets the
        exception (a row error). Sentences need no call: the default is None for every case.
        """
        return [None] * len(cases)

    def prepare(self, case: RecallCase, context: list[str] | None, units: Units | None = None) -> Prepared | Missing:
        """Validate and split (or take ``units``); never calls the judge."""
        raise NotImplementedError

    def finalize(self, prepared: Prepared, response: JudgeResponse, latency_ms: float) -> RecallResult:
        """Score, success and reason from the verdicts; pure."""
        statements = prepared.request.statements
        verdicts = [
            Verdict(statement=s, verdict=v.verdict, reason=v.reason, chunk_ids=v.chunk_ids, flagged=v.flagged)
            for s, v in zip(statements, response.verdicts, strict=True)
        ]
        attributed = sum(v.verdict == "yes" for v in verdicts)
        total = len(verdicts)
        all_or_nothing = self.scale if attributed == total else 0.0
        score = all_or_nothing if self.strict_mode else attributed / total * self.scale
        use = None
        if self.task == "contextual_recall":
            use = chunk_use((v.chunk_ids for v in verdicts if v.verdict == "yes"), prepared.context_count)
        requests, prompt_tokens, completion_tokens = (
            response.requests,
            response.prompt_tokens,
            response.completion_tokens,
        )
        cost, flags = response.cost_usd, response.flags
        if prepared.units is not None:
            u = prepared.units
            requests, prompt_tokens, completion_tokens = (
                requests + u.requests,
                prompt_tokens + u.prompt_tokens,
                completion_tokens + u.completion_tokens,
            )
            cost = None if cost is None and u.cost_usd is None else (cost or 0.0) + (u.cost_usd or 0.0)
            flags = [*u.flags, *flags]
        metadata = ResultMetadata(
            context_precision=use.context_precision if use else None,
            chunks_used=use.chunks_used if use else None,
            first_relevant_rank=use.first_relevant_rank if use else None,
            metric=self.task,
            sentence_count=prepared.sentence_count,
            attributed_count=attributed,
            context_count=prepared.context_count,
            latency_ms=latency_ms,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=cost,
            requests=requests,
            judge_model=response.model,
            prompt_version=response.prompt_version,
            flags=flags,
            reply_model=response.reply_model,
        )
        return RecallResult(
            score=score,
            success=score >= self.threshold,
            threshold=self.threshold,
            reason=self._reason(score, verdicts, response.summary) if self.include_reason else None,
            verdicts=verdicts,
            metadata=metadata,
        )

    def not_assessed(self, reason: str, *, sentence_count: int = 0, context_count: int = 0) -> RecallResult:
        """A result without a score (never averaged as 0): missing inputs under ``skip``, or not judged."""
        metadata = ResultMetadata(
            metric=self.task, sentence_count=sentence_count, context_count=context_count,
            judge_model=self.judge.model, prompt_version=self.judge.prompt_version, flags=[reason],
        )  # fmt: skip
        return RecallResult(
            score=None, success=None, threshold=self.threshold, skipped=True, reason=reason, metadata=metadata
        )

    def missing_result(self, missing: Missing, context_count: int = 0) -> RecallResult:
        """The result of a case with a missing field under the ``zero`` or ``skip`` policy."""
        if self.on_missing == "error":
            raise MissingInputError(missing.field, self.display_name)
        if self.on_missing == "skip":
            return self.not_assessed(f"not assessed: {missing.field} is missing or empty", context_count=context_count)
        zero = self.not_assessed(f"score 0: {missing.field} is missing or empty", context_count=context_count)
        return zero.model_copy(update={"score": 0.0, "success": self.threshold <= 0.0, "skipped": False})

    # -- public API ------------------------------------------------------------------------------

    async def a_measure(self, case: RecallCase) -> RecallResult:
        """Measure one case: one judge call (plus the claims' extraction), none when an input is missing."""
        context = await self.resolve_context(case)
        units = (await self.resolve_units([case], [context]))[0]
        if isinstance(units, BaseException):
            raise units
        prepared = self.prepare(case, context, units)
        if isinstance(prepared, Missing):
            return self.missing_result(prepared, len(context or []))
        started = time.perf_counter()
        response = await self.judge.judge(prepared.request)
        return self.finalize(prepared, response, (time.perf_counter() - started) * 1000)

    def measure(self, case: RecallCase) -> RecallResult:
        """Sync convenience over :meth:`a_measure` (same code path, run on a background loop)."""
        return run_sync(self.a_measure(case))

    # -- reason ----------------------------------------------------------------------------------

    def _reason(self, score: float, verdicts: list[Verdict], summary: str) -> str:
        total = len(verdicts)
        missing = [(i, v) for i, v in enumerate(verdicts, 1) if v.verdict == "no"]
        supported = [(i, v) for i, v in enumerate(verdicts, 1) if v.verdict == "yes"]
        head = f"The score is {score:.2f} because "
        if not missing:
            head += f"all {total} {self.unit}s are {self.supported_word}."
        else:
            head += (
                f"{len(missing)} of {total} {self.unit}{'s' if total > 1 else ''} "
                f"{'is' if len(missing) == 1 else 'are'} not {self.supported_word}: "
            )
            head += "; ".join(
                f'[{i}] "{_clip(v.statement)}"' + (f" ({v.reason})" if v.reason else "") for i, v in missing
            )
            head += "."
        if supported:
            head += (
                f" {self.supported_word.capitalize()}: "
                + ", ".join(
                    f"[{i}] by {self.evidence_unit} {'+'.join(map(str, v.chunk_ids))}" if v.chunk_ids else f"[{i}]"
                    for i, v in supported
                )
                + "."
            )
        if summary:
            head += f" Judge summary: {summary}"
        return head

    supported_word: ClassVar[str] = "supported"
