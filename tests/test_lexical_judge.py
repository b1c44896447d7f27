"""The offline lexical judge: seeds, numbers, negation, adjacency, languages, contract, labelled accuracy."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from recall_tasks.judges.base import Judge, JudgeRequest, JudgeResponse
from recall_tasks.judges.lexical import LexicalJudge, extract_numbers, key_terms, stem

LABELLED = Path(__file__).parent / "data" / "lexical_labelled.jsonl"

# Floors set a little below what the judge achieves today (0.835 overall, 0.972 on non-hard rows);
# the hard rows (paraphrase with other words, antonyms, unit conversion) are expected to fail (1 of 25 passes:
# the version-number row, since 3.12.0 reads as 3.12).
OVERALL_FLOOR = 0.80
NON_HARD_FLOOR = 0.95


def recall(statements: list[str], evidence: list[str], question: str = "", **kwargs: Any) -> JudgeResponse:
    request = JudgeRequest(
        task="contextual_recall", question=question, statements=statements, evidence=evidence, **kwargs
    )
    return asyncio.run(LexicalJudge().judge(request))


def coverage(items: list[str], answer: list[str], **kwargs: Any) -> JudgeResponse:
    request = JudgeRequest(task="context_coverage", question="", statements=items, evidence=answer, **kwargs)
    return asyncio.run(LexicalJudge().judge(request))


def labels(response: JudgeResponse) -> list[str]:
    return [v.verdict for v in response.verdicts]


# -- the labelled set --------------------------------------------------------------------------------


def load_labelled() -> list[dict[str, Any]]:
    with LABELLED.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_labelled_file_is_well_formed() -> None:
    rows = load_labelled()
    assert len(rows) >= 120
    for row in rows:
        assert set(row) == {"task", "question", "statement", "evidence", "label", "note"}, row
        assert row["task"] in ("contextual_recall", "context_coverage")
        assert row["label"] in ("yes", "no")
        assert isinstance(row["evidence"], list) and row["evidence"], row
        assert all(isinstance(e, str) and e for e in row["evidence"])
        assert row["statement"] and row["note"]
    tasks = Counter(row["task"] for row in rows)
    assert tasks["context_coverage"] >= 15
    assert sum(row["note"] == "hard: paraphrase" for row in rows) >= 14
    assert Counter(row["label"] for row in rows)["no"] >= 50


def test_accuracy_on_labelled_examples() -> None:
    judge = LexicalJudge()
    rows = load_labelled()
    correct = correct_non_hard = non_hard = 0
    wrong: list[str] = []
    for row in rows:
        request = JudgeRequest(
            task=row["task"],
            question=row["question"],
            statements=[row["statement"]],
            evidence=row["evidence"],
        )
        verdict = judge.judge_sync(request).verdicts[0]
        ok = verdict.verdict == row["label"]
        hard = row["note"].startswith("hard")
        correct += ok
        if not hard:
            non_hard += 1
            correct_non_hard += ok
        if not ok:
            note, text, want = row["note"], row["statement"][:70], row["label"]
            wrong.append(f"  [{note}] {text!r}: want {want}, got {verdict.reason}")
    overall = correct / len(rows)
    ordinary = correct_non_hard / non_hard
    hard_total = len(rows) - non_hard
    print(
        f"\nlexical judge accuracy: overall {correct}/{len(rows)} = {overall:.3f}; "
        f"non-hard {correct_non_hard}/{non_hard} = {ordinary:.3f}; "
        f"hard {correct - correct_non_hard}/{hard_total}"
    )
    print("disagreements:\n" + "\n".join(wrong))
    assert overall >= OVERALL_FLOOR
    assert ordinary >= NON_HARD_FLOOR


# -- seeds ---------------------------------------------------------------------------------------------


def test_seed_einstein() -> None:
    response = recall(
        ["Einstein was born in 1879.", "He developed relativity.", "He won the Nobel Prize."],
        [
            "Document 1: Einstein was born on 14 March 1879 in Ulm, Germany.",
            "Document 2: Einstein published the theory of special relativity in 1905.",
            "Document 3: Einstein moved to the United States in 1933.",
        ],
    )
    assert labels(response) == ["yes", "yes", "no"]
    assert [v.chunk_ids for v in response.verdicts] == [[1], [2], []]
    assert response.verdicts[0].reason.startswith("supported by chunk 1 (")
    assert response.verdicts[2].reason.startswith("not supported: missing ")
    assert "'nobel'" in response.verdicts[2].reason and "'prize'" in response.verdicts[2].reason


def test_seed_paris() -> None:
    response = recall(
        ["Paris is the capital of France.", "It is known for the Eiffel Tower."],
        ["Paris is the capital city of France.", "The Eiffel Tower is located in Paris."],
    )
    assert labels(response) == ["yes", "yes"]
    assert [v.chunk_ids for v in response.verdicts] == [[1], [2]]


def test_seed_deepevalex_nobel() -> None:
    response = recall(
        [
            "Einstein won the Nobel Prize in Physics in 1921.",
            "He received it for his explanation of the photoelectric effect.",
            "The award ceremony was held in Stockholm.",
        ],
        [
            "Albert Einstein won the Nobel Prize in Physics in 1921.",
            "Einstein's work on the photoelectric effect earned him the Nobel Prize.",
        ],
    )
    assert labels(response) == ["yes", "yes", "no"]
    assert [v.chunk_ids for v in response.verdicts] == [[1], [2], []]


def test_seed_mastra_security_coverage() -> None:
    items = [
        "All data is encrypted at rest and in transit",
        "Two-factor authentication (2FA) is mandatory",
        "Regular security audits are performed",
        "Incident response team available 24/7",
    ]
    answer = ["The company implements encryption for data protection and requires 2FA for all users."]
    response = coverage(items, answer)
    assert labels(response) == ["yes", "yes", "no", "no"]
    assert sum(v.verdict == "yes" for v in response.verdicts) / len(items) == 0.5
    assert [v.chunk_ids for v in response.verdicts] == [[1], [1], [], []]
    assert response.verdicts[0].reason.startswith("used in answer sentence 1")
    assert response.verdicts[2].reason.startswith("not used: missing ")


# -- numbers -------------------------------------------------------------------------------------------


def test_number_formats_match() -> None:
    response = recall(
        ["The city has 1,500,000 inhabitants.", "Inflation reached 12%."],
        ["The city has 1.5 million inhabitants.", "Inflation reached 12 percent last year."],
    )
    assert labels(response) == ["yes", "yes"]
    assert [v.chunk_ids for v in response.verdicts] == [[1], [2]]


def test_year_mismatch_is_not_supported() -> None:
    response = recall(["He was born in 1897."], ["He was born in 1879 in Ulm."])
    assert labels(response) == ["no"]
    assert response.verdicts[0].reason == "number mismatch: 1897 vs 1879"


PY312 = ["Python 3.12.0 was released on 2 October 2023.", "The release brought more helpful error messages."]


@pytest.mark.parametrize(
    ("statement", "verdict", "reason"),
    [
        # the demo's former false negative: 3.12 and 3.12.0 are one version; a dated day supports month-year
        ("Python 3.12 was released in October 2023.", "yes", "supported by chunk 1"),
        ("Python 3.12.0 was released in October 2023.", "yes", "supported by chunk 1"),
        ("Python 3.12 was released on 2 October 2023.", "yes", "supported by chunk 1"),
        ("Python 3.11 was released in October 2023.", "no", "number mismatch: 3.11 vs"),
        ("Python 3.12.1 was released in October 2023.", "no", "not supported: missing '3.12.1'"),
        ("Python 3.12 was released in November 2023.", "no", "not supported: missing 'november'"),
        ("Python 3.12 was released in October 2022.", "no", "number mismatch: 2022 vs 2023"),
    ],
)
def test_version_numbers_and_dates(statement: str, verdict: str, reason: str) -> None:
    response = recall([statement], PY312, question="When was Python 3.12 released?")
    assert labels(response) == [verdict]
    assert response.verdicts[0].reason.startswith(reason), response.verdicts[0].reason


def test_a_zero_patch_version_in_the_statement_matches_the_short_form() -> None:
    assert labels(recall(["Python 3.12.0 was released."], ["Python 3.12 was released on 2 October 2023."])) == ["yes"]
    assert extract_numbers("3.12.0 and 3.0.0 and 3.12.1") == [3.12, 3.0]


def test_extra_numbers_in_evidence_are_fine() -> None:
    response = recall(["Einstein was born in Ulm."], ["Einstein was born in Ulm on 14 March 1879."])
    assert labels(response) == ["yes"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,500,000", [1_500_000.0]),
        ("1.5 million", [1_500_000.0]),
        ("1.5M", [1_500_000.0]),
        ("1500000", [1_500_000.0]),
        ("2 billion", [2e9]),
        ("$2bn", [2e9]),
        ("3k", [3000.0]),
        ("12%", [12.0]),
        ("12 per cent", [12.0]),
        ("twelve", [12.0]),
        ("twenty-five", [25.0]),
        ("one hundred and five", [105.0]),
        ("a million", [1e6]),
        ("1,5 millones", [1_500_000.0]),
        ("150万", [1_500_000.0]),
        ("the 1990s", [1990.0]),
        ("5km", [5.0]),
        ("Two-factor authentication", []),
        ("one of the founders", []),
    ],
)
def test_extract_numbers(text: str, expected: list[float]) -> None:
    assert extract_numbers(text) == expected


# -- negation ------------------------------------------------------------------------------------------


def test_negation_mismatch() -> None:
    response = recall(
        ["Einstein did not win the Nobel Prize.", "The API supports batch requests."],
        ["Einstein won the Nobel Prize in 1921.", "The API does not support batch requests."],
    )
    assert labels(response) == ["no", "no"]
    assert response.verdicts[0].reason == "negation mismatch with chunk 1"
    assert response.verdicts[1].reason == "negation mismatch with chunk 2"


def test_negation_on_both_sides_agrees() -> None:
    response = recall(
        ["The free plan doesn't include API access."],
        ["API access is not included in the free plan; upgrade to Pro to use the API."],
    )
    assert labels(response) == ["yes"]


def test_negation_only_counts_in_the_matching_clause() -> None:
    response = recall(
        ["The bridge was completed in 1932."],
        ["The tunnel was never finished, but the bridge was completed in 1932."],
    )
    assert labels(response) == ["yes"]


# -- adjacency -----------------------------------------------------------------------------------------

PRICE = "Tesla Model 3 pricing: the Model 3 starts at $38,990 before incentives."
RANGE = "Range: the rear-wheel-drive Model 3 has an EPA-estimated range of 272 miles."
OTHER = "Charging: Supercharging adds up to 175 miles in 15 minutes."
SPLIT_STATEMENT = "The Model 3 starts at $38,990 and has a range of 272 miles."


def test_adjacent_pair_supports() -> None:
    response = recall([SPLIT_STATEMENT], [OTHER, PRICE, RANGE])
    assert labels(response) == ["yes"]
    assert response.verdicts[0].chunk_ids == [2, 3]
    assert response.verdicts[0].reason.startswith("supported by chunks 2+3")


def test_non_adjacent_split_does_not_support() -> None:
    response = recall([SPLIT_STATEMENT], [PRICE, OTHER, RANGE])
    assert labels(response) == ["no"]
    assert response.verdicts[0].chunk_ids == []


def test_single_chunk_preferred_over_pair() -> None:
    response = recall(
        ["Mercury is the smallest planet in the Solar System."],
        ["Mercury is the smallest planet in the Solar System.", "It orbits the Sun in 88 days."],
    )
    assert response.verdicts[0].chunk_ids == [1]


# -- languages -----------------------------------------------------------------------------------------


def test_accents() -> None:
    accented = recall(["Málaga is a city in Andalusia."], ["Malaga is a port city in Andalusia."])
    plain = recall(["Malaga is a city in Andalusia."], ["Málaga is a port city in Andalusía."])
    assert labels(accented) == labels(plain) == ["yes"]


def test_chinese() -> None:
    statement = ["巴黎是法国的首都。"]
    assert labels(recall(statement, ["法国的首都是巴黎，也是该国最大的城市。"])) == ["yes"]
    assert labels(recall(statement, ["今天北京的天气晴朗，气温二十度。"])) == ["no"]


def test_japanese_and_german() -> None:
    assert labels(recall(["東京は日本の首都です。"], ["日本の首都は東京である。"])) == ["yes"]
    assert labels(recall(["Das Produkt ist nicht wasserdicht."], ["Das Produkt ist wasserdicht."])) == ["no"]


def test_key_terms_normalisation() -> None:
    assert key_terms("Málaga") == key_terms("MALAGA") == ["malaga"]
    assert key_terms("He developed it") == key_terms("the development") == ["develop"]
    assert key_terms("爱因斯坦") == ["爱因", "因斯", "斯坦"]
    assert key_terms("Москва") == ["москва"]
    assert key_terms("The tower is 300 m tall") == key_terms("the tower is 300 metres tall")
    assert key_terms("300 meters") == key_terms("300m") == ["#300", "metr"]


@pytest.mark.parametrize(
    "words",
    [
        ("encrypted", "encryption", "encrypts", "encrypting"),
        ("developed", "develops", "development", "developing", "developer"),
        ("studies", "studied", "study"),
        ("use", "used", "uses", "using"),
        ("effective", "effect"),
        ("won", "win", "winning", "wins"),
        ("receive", "received", "receiving"),
    ],
)
def test_stemmer_conflates_families(words: tuple[str, ...]) -> None:
    assert len({stem(w) for w in words}) == 1, {w: stem(w) for w in words}


def test_stemmer_keeps_short_words() -> None:
    assert stem("water") == "water"
    assert stem("tower") == "tower"
    assert stem("bus") == "bus"


# -- contract ------------------------------------------------------------------------------------------


def test_verdict_count_and_ids() -> None:
    statements = ["Paris is in France.", "Berlin is in Germany.", "Rome is in Italy.", "Lisbon is in Spain."]
    response = recall(statements, ["Paris is the capital of France.", "Rome is the capital of Italy."])
    assert len(response.verdicts) == len(statements)
    assert [v.id for v in response.verdicts] == [1, 2, 3, 4]
    assert labels(response) == ["yes", "no", "yes", "no"]
    for v in response.verdicts:
        assert (v.verdict == "yes") == bool(v.chunk_ids)
        assert all(1 <= c <= 2 for c in v.chunk_ids)


def test_deterministic() -> None:
    statements = ["Einstein won the Nobel Prize in 1921.", "He was born in Ulm.", "He died in 1955."]
    evidence = [
        "Einstein received the 1921 Nobel Prize.",
        "Einstein was born in Ulm.",
        "He died in Princeton.",
    ]
    first = recall(statements, evidence)
    second = LexicalJudge().judge_sync(
        JudgeRequest(task="contextual_recall", question="", statements=statements, evidence=evidence)
    )
    assert first.model_dump() == second.model_dump()


def test_without_reasons() -> None:
    statements = ["Einstein was born in 1897.", "He was born in Ulm.", "He did not live in Ulm."]
    evidence = ["Einstein was born in Ulm in 1879."]
    response = recall(statements, evidence, include_reason=False)
    assert labels(response) == ["no", "yes", "no"]
    assert [v.reason for v in response.verdicts] == ["", "", ""]
    response = coverage(["Einstein was born in Ulm.", "The sky is blue."], evidence, include_reason=False)
    assert [v.reason for v in response.verdicts] == ["", ""]


def test_empty_evidence() -> None:
    response = recall(["Paris is the capital of France.", "It has the Eiffel Tower."], [])
    assert labels(response) == ["no", "no"]
    assert [v.id for v in response.verdicts] == [1, 2]
    assert labels(recall(["Paris is the capital of France."], ["", "   "])) == ["no"]


def test_statement_without_key_terms() -> None:
    response = recall(["It is what it is."], ["Paris is the capital of France."])
    assert labels(response) == ["no"]


def test_response_metadata_and_config() -> None:
    judge = LexicalJudge()
    assert isinstance(judge, Judge)
    assert judge.model == "lexical"
    assert judge.prompt_version == "lexical-v3"
    config = judge.config()
    assert config["judge"] == "lexical"
    assert config["version"] == "lexical-v3"
    assert 0 < config["support_threshold"] <= 1 and 0 < config["coverage_threshold"] <= 1
    response = recall(["Paris is the capital of France."], ["Paris is the capital of France."])
    assert response.model == "lexical"
    assert response.prompt_version == "lexical-v3"
    assert response.requests == 0
    assert response.prompt_tokens == 0
    assert response.completion_tokens == 0
    assert response.cost_usd == 0.0


def test_thresholds_are_configurable_and_validated() -> None:
    strict = LexicalJudge(support_threshold=1.0)
    request = JudgeRequest(
        task="contextual_recall",
        question="",
        statements=["He developed relativity."],
        evidence=["Einstein published the theory of special relativity in 1905."],
    )
    assert labels(strict.judge_sync(request)) == ["no"]
    assert strict.config()["support_threshold"] == 1.0
    with pytest.raises(ValueError, match="support_threshold must be in"):
        LexicalJudge(support_threshold=0.0)
    with pytest.raises(ValueError, match="coverage_threshold must be in"):
        LexicalJudge(coverage_threshold=1.5)


# -- the held-out set (written after the tuning; never used to change the judge) ---------------------------

HELDOUT = Path(__file__).parent / "data" / "lexical_heldout.jsonl"


def test_heldout_set_is_well_formed_and_accuracy_holds() -> None:
    from benchmarks.lexical_accuracy import measure

    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 60
    for row in rows:
        assert set(row) == {"task", "category", "question", "statement", "evidence", "label"}, row
        assert row["label"] in ("yes", "no") and row["evidence"] and row["category"]
    assert len({row["category"] for row in rows}) >= 10
    cal = measure(HELDOUT)  # what `recall-bench calibrate HELDOUT --judge lexical` measures
    assert cal.status == "completed" and cal.overall.units == len(rows)
    right = cal.overall.confusion.tp + cal.overall.confusion.tn
    ordinary = [r for r in cal.paired if r.category != "hard-paraphrase"]
    ordinary_right = sum(h == j for r in ordinary for h, j in zip(r.human, r.judge, strict=True))
    # the README's figures (53/64, 53/56 without the paraphrases): a drop means the judge got worse
    assert right >= 53
    assert ordinary_right / len(ordinary) >= 0.94
