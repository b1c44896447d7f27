"""recall-bench: contextual recall of retrieval systems, scored as a scheduled, cheap, trustworthy job.

The public names are imported on first use (PEP 562): ``recall-bench server status`` or a lexical-judge run
must not pay for ``openai`` (~1 s of imports) just because ``recall_tasks`` is a package of the CLI. Importing it
sets nothing in the host process (no environment variable, collector threshold or allocator setting): what the
``recall-bench`` process needs, ``cli.app.settle_process`` sets.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recall_tasks.cli.evaluation import Evaluation, a_evaluate, evaluate
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

_WHERE = {
    "recall_tasks.cli.evaluation": ["Evaluation", "a_evaluate", "evaluate"],
    "recall_tasks.errors": [
        "ConfigError", "DatasetError", "JudgeConfigError", "JudgeError", "JudgeResponseError", "JudgeTransientError",
        "MissingInputError", "RecallBenchError", "StorageError",
    ],
    "recall_tasks.judges": ["Judge", "JudgeRequest", "JudgeResponse", "LexicalJudge", "OpenAIJudge"],
    "recall_tasks.metrics": ["ContextCoverage", "ContextualRecall"],
    "recall_tasks.models": ["RecallCase", "RecallResult", "ResultMetadata", "Verdict"],
    "recall_tasks.sentences": ["split_sentences"],
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'recall_tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


__all__ = [
    "ConfigError",
    "ContextCoverage",
    "ContextualRecall",
    "DatasetError",
    "Evaluation",
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
    "a_evaluate",
    "evaluate",
    "split_sentences",
]
