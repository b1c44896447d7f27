"""Judges decide statements against evidence: an LLM behind the OpenAI API, or the offline lexical judge.

Both judges are imported on first use: the ``openai`` SDK costs ~1 s of imports that offline runs skip, and
the lexical judge's tables ~40 ms that an LLM-judged run pays before its first request otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse, JudgeVerdict

if TYPE_CHECKING:
    from recall_tasks.judges.lexical import LexicalJudge
    from recall_tasks.judges.openai_judge import OpenAIJudge


def __getattr__(name: str) -> Any:
    if name == "OpenAIJudge":
        from recall_tasks.judges.openai_judge import OpenAIJudge

        return OpenAIJudge
    if name == "LexicalJudge":
        from recall_tasks.judges.lexical import LexicalJudge

        return LexicalJudge
    raise AttributeError(f"module 'recall_tasks.judges' has no attribute {name!r}")


__all__ = ["Judge", "JudgeRequest", "JudgeResponse", "JudgeVerdict", "LexicalJudge", "OpenAIJudge"]
