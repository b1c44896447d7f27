"""The label-answering judge of the fake server (tests/judge_labels.py): known flips, answered over real HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from recall_tasks.analysis.agreement import agreement
from recall_tasks.io.labels import load_labels
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.metrics.coverage import ContextCoverage
from recall_tasks.metrics.recall import ContextualRecall
from recall_tasks.pipeline.scoring import score_rows
from tests.fake_openai import FakeOpenAI
from tests.judge_labels import LabelJudge

HELDOUT = Path(__file__).parent / "data" / "lexical_heldout.jsonl"


def test_flips_exactly_the_share_asked_and_always_the_same_units() -> None:
    labelled = load_labels(str(HELDOUT))
    assert LabelJudge(labelled).flipped == set()
    judge = LabelJudge(labelled, 0.2)
    assert len(judge.flipped) == 64 // 5 == 12
    assert judge.flipped == LabelJudge(labelled, 0.2).flipped
    assert judge.flipped != LabelJudge(labelled, 0.2, salt="other night").flipped
    assert len(LabelJudge(labelled, 0.5).flipped) == 32
    assert agreement(judge.expected_rows()).accuracy.value == pytest.approx(52 / 64)
    assert agreement(LabelJudge(labelled).expected_rows()).kappa.value == pytest.approx(1.0)
    with pytest.raises(ValueError, match="flip_rate"):
        LabelJudge(labelled, 1.5)


@pytest.mark.parametrize("rate", [0.0, 0.2])
def test_the_judge_answers_labels_over_http(fake_openai: FakeOpenAI, rate: float) -> None:
    labelled = load_labels(str(HELDOUT))
    judge = LabelJudge(labelled, rate)
    fake_openai.set_responder(judge)
    client = OpenAIJudge(base_url=fake_openai.base_url, api_key="sk-test", max_retries=0)
    answered: list[list[bool]] = []
    for task, metric in (("contextual_recall", ContextualRecall(judge=client)),
                         ("context_coverage", ContextCoverage(judge=client))):  # fmt: skip
        rows = [r for r in labelled.rows if r.task == task]
        outcomes = asyncio.run(score_rows(metric, [r.row for r in rows]))
        for r, out in zip(rows, outcomes, strict=True):
            assert out.error is None and out.result is not None
            assert [v.statement for v in out.result.verdicts] == r.units
            answered.append([v.verdict == "yes" for v in out.result.verdicts])
    order = [i for t in ("contextual_recall", "context_coverage") for i, r in enumerate(labelled.rows) if r.task == t]
    assert answered == [judge.answers[i] for i in order]
    assert len(fake_openai.requests) == 64  # every row a labelled one: no fallback needed
    wrong = sum(a != (r.labels or []) for a, r in zip(judge.answers, labelled.rows, strict=True))
    assert wrong == len(judge.flipped) == (12 if rate else 0)  # floor(64 x 0.2) = 12 units answered wrong


def test_unlabelled_requests_fall_back_to_the_word_rule(fake_openai: FakeOpenAI) -> None:
    fake_openai.set_responder(LabelJudge(load_labels(str(HELDOUT)), 0.2))
    client = OpenAIJudge(base_url=fake_openai.base_url, api_key="sk-test", max_retries=0)
    row = {"input": "", "expected_output": "Bees make honey.", "retrieval_context": ["Bees make honey daily."]}
    out = asyncio.run(score_rows(ContextualRecall(judge=client), [row]))[0]
    assert out.result is not None and out.result.score == 1.0
