"""Typed data of the metric: cases in, verdicts and results out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

VerdictLabel = Literal["yes", "no"]
OnMissing = Literal["error", "zero", "skip"]


class RecallCase(BaseModel):
    """One evaluation row: the question, the ground truth, what the retriever returned (and the answer)."""

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    input: str | None = None
    expected_output: str | None = None
    retrieval_context: list[str] | None = Field(
        default=None, validation_alias=AliasChoices("retrieval_context", "context")
    )
    actual_output: str | None = None
    row_id: str | None = None

    @field_validator("retrieval_context", mode="before")
    @classmethod
    def _context_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("retrieval_context must be a list of strings, not a single string")
        if value is not None and not isinstance(value, list | tuple):
            value = list(value)
        return value


class Verdict(BaseModel):
    """The judge's decision on one unit (a sentence for recall, a context item for coverage)."""

    statement: str
    verdict: VerdictLabel
    reason: str = ""
    chunk_ids: list[int] = Field(default_factory=list)
    flagged: str | None = None  # e.g. "missing from judge output, counted as no"


class ResultMetadata(BaseModel):
    """Counts and costs of one measurement."""

    metric: str
    sentence_count: int = 0
    attributed_count: int = 0
    context_count: int = 0
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    requests: int = 0
    judge_model: str = ""
    prompt_version: str = ""
    flags: list[str] = Field(default_factory=list)
    #: the model the judge's reply named (another than ``judge_model`` when a gateway fell back); None: not said
    reply_model: str | None = None
    #: context precision from the same verdicts (contextual recall only; see ``metrics.precision``)
    context_precision: float | None = None
    chunks_used: int | None = None
    first_relevant_rank: int | None = None


class RecallResult(BaseModel):
    """The outcome of measuring one case. ``score is None`` means not assessed (``skipped``) or errored."""

    score: float | None
    success: bool | None
    threshold: float
    reason: str | None
    verdicts: list[Verdict] = Field(default_factory=list)
    metadata: ResultMetadata
    skipped: bool = False
    error: str | None = None
