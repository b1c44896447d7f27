"""recall-bench: contextual recall of retrieval systems, scored as a scheduled, cheap, trustworthy job."""

from recall_tasks.errors import (
    ConfigError,
    DatasetError,
    JudgeConfigError,
    JudgeError,
    JudgeResponseError,
    JudgeTransientError,
    MissingInputError,
    RecallBenchError,
    StorageError,
)
from recall_tasks.judges import Judge, JudgeRequest, JudgeResponse, LexicalJudge, OpenAIJudge
from recall_tasks.metrics import ContextCoverage, ContextualRecall
from recall_tasks.models import RecallCase, RecallResult, ResultMetadata, Verdict
from recall_tasks.sentences import split_sentences

__all__ = [
    "ConfigError",
    "ContextCoverage",
    "ContextualRecall",
    "DatasetError",
    "Judge",
    "JudgeConfigError",
    "JudgeError",
    "JudgeRequest",
    "JudgeResponse",
    "JudgeResponseError",
    "JudgeTransientError",
    "LexicalJudge",
    "MissingInputError",
    "OpenAIJudge",
    "RecallBenchError",
    "RecallCase",
    "RecallResult",
    "ResultMetadata",
    "StorageError",
    "Verdict",
    "split_sentences",
]
