"""Judges decide statements against evidence: an LLM behind the OpenAI API, or the offline lexical judge."""

from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse, JudgeVerdict
from recall_tasks.judges.lexical import LexicalJudge
from recall_tasks.judges.openai_judge import OpenAIJudge

__all__ = ["Judge", "JudgeRequest", "JudgeResponse", "JudgeVerdict", "LexicalJudge", "OpenAIJudge"]
