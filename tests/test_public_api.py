"""The public API is what `recall_tasks.__all__` says, and every name in it is importable and documented."""

from __future__ import annotations

import recall_tasks

PUBLIC = {
    "ConfigError", "ContextCoverage", "ContextualRecall", "DatasetError", "Evaluation", "Judge", "JudgeConfigError",
    "JudgeError", "JudgeRequest", "JudgeResponse", "JudgeResponseError", "JudgeTransientError", "LexicalJudge",
    "MissingInputError", "OpenAIJudge", "RecallBenchError", "RecallCase", "RecallResult", "ResultMetadata",
    "StorageError", "Verdict", "a_evaluate", "evaluate", "split_sentences",
}  # fmt: skip


def test_all_is_pinned():
    assert set(recall_tasks.__all__) == PUBLIC
    assert sorted(recall_tasks.__all__) == recall_tasks.__all__


def test_every_public_name_is_importable_and_documented():
    for name in recall_tasks.__all__:
        obj = getattr(recall_tasks, name)
        assert obj.__doc__ and obj.__doc__.strip(), name


def test_context_alias_and_sync_wrapper():
    from recall_tasks import ContextualRecall, LexicalJudge, RecallCase

    case = RecallCase(
        input="q", expected_output="Paris is the capital of France.", context=["Paris is the capital city of France."]
    )
    assert case.retrieval_context == ["Paris is the capital city of France."]
    result = ContextualRecall(judge=LexicalJudge()).measure(case)
    assert result.score == 1.0 and result.verdicts[0].verdict == "yes" and result.verdicts[0].chunk_ids == [1]
    assert result.metadata.judge_model == "lexical" and result.metadata.requests == 0
