"""Judges decide statements against evidence: an LLM behind the OpenAI API, or the offline lexical judge.

``OpenAIJudge`` is imported on first use: the ``openai`` SDK costs ~1 s of imports that offline runs skip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse, JudgeVerdict
from recall_tasks.judges.lexical import LexicalJudge

if TYPE_CHECKING:
    from recall_tasks.judges.openai_judge import OpenAIJudge


def __getattr__(name: str) -> Any:
    if name == "OpenAIJudge":
        from recall_tasks.judges.openai_judge import OpenAIJudge

        return OpenAIJudge
    raise AttributeError(f"module 'recall_tasks.judges' has no attribute {name!r}")


__all__ = ["Judge", "JudgeRequest", "JudgeResponse", "JudgeVerdict", "LexicalJudge", "OpenAIJudge"]
