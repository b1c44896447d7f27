"""Claims as units (``--units claims``): extraction once per distinct reference, cached, checked, the fallback."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks import ConfigError, ContextualRecall, RecallCase
from recall_tasks._sync import run_sync
from recall_tasks.config import RunParams
from recall_tasks.errors import BudgetExhausted, RunFailed
from recall_tasks.judges.parsing import ParseError, parse_claims
from recall_tasks.metrics.claims import claims_problem, traceable
from recall_tasks.pipeline import steps
from recall_tasks.pipeline.scoring import metric_fingerprint
from tests import judge_script
from tests.fake_openai import Status
from tests.test_pipeline import KEY, WORDS

EINSTEIN = "Einstein was born in 1879 and developed relativity."


# -- checks and parsing --------------------------------------------------------------------------------


def test_traceable_is_a_content_word_overlap() -> None:
    assert traceable("Einstein was born in 1879.", EINSTEIN)
    assert traceable("Einstein developed the theory of relativity.", EINSTEIN)  # 3 of 4 content words
    assert traceable("He develops relativity.", EINSTEIN)  # 'develops' ~ 'developed' (first 5 letters)
    assert not traceable("Einstein won the Nobel Prize in 1921.", EINSTEIN)  # 1 of 5
    assert traceable("Einstein was born in 1880.", "Einstein was born in 1879.")  # 2 of 3: a lexical test
    assert not traceable("It is.", EINSTEIN)  # no content word


def test_claims_problem_names_each_bad_extraction() -> None:
    assert claims_problem(["Einstein was born in 1879.", "Einstein developed relativity."], EINSTEIN, 1) is None
    assert claims_problem([], EINSTEIN, 1) == "no claims"
    assert "more than 3x" in (claims_problem([f"Einstein {k}." for k in range(4)], EINSTEIN, 1) or "")
    assert "not traceable" in (claims_problem(["Bananas are yellow."], EINSTEIN, 1) or "")


def test_parse_claims() -> None:
    assert parse_claims('{"claims": [" A  b. ", "", "A b."]}') == ["A b."]
    assert parse_claims('["x"]') == ["x"]
    assert parse_claims('```json\n{"claims": ["y"]}\n```') == ["y"]
    for bad in ('{"claims": "x"}', '{"claims": [1]}', "no json", '{"other": []}'):
        with pytest.raises(ParseError):
            parse_claims(bad)


def test_sentence_fingerprint_unchanged_and_claims_fingerprint_differs(fake_openai, monkeypatch) -> None:
    import hashlib

    from recall_tasks.judges.openai_judge import OpenAIJudge
    from recall_tasks.sentences import SPLITTER_VERSION

    judge = OpenAIJudge(base_url=fake_openai.base_url, api_key="sk-test")
    sentences = ContextualRecall(judge=judge)
    before = {
        "task": "contextual_recall",
        "include_reason": True,
        "splitter": SPLITTER_VERSION,
        "judge": judge.config(),
    }
    old = hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:24]
    assert metric_fingerprint(sentences) == old  # verdict caches and judge_config of sentence runs unchanged
    assert metric_fingerprint(ContextualRecall(judge=judge, units="claims")) != old


# -- the metric against the fake OpenAI server -----------------------------------------------------------


def _metric(fake_openai, **kw):
    from recall_tasks.judges.openai_judge import OpenAIJudge

    return ContextualRecall(judge=OpenAIJudge(base_url=fake_openai.base_url, api_key="sk-test"), units="claims", **kw)


def _extractions(fake_openai) -> list[dict]:
    return [r["body"] for r in fake_openai.chat_requests if judge_script.is_extraction(r["body"])]


def test_claims_are_extracted_once_then_judged_as_statements(fake_openai) -> None:
    fake_openai.set_responder(judge_script.claims_responder())
    metric = _metric(fake_openai)
    case = RecallCase(input="Who?", expected_output=EINSTEIN, retrieval_context=["Einstein was born in 1879 in Ulm."])
    result = metric.measure(case)
    assert [v.statement for v in result.verdicts] == ["Einstein was born in 1879.", "Einstein developed relativity."]
    assert result.score == 0.5 and result.metadata.sentence_count == 2
    assert result.metadata.requests == 2 and "claims" in (result.reason or "")
    (extraction,) = _extractions(fake_openai)
    assert extraction["response_format"]["json_schema"]["name"] == "recall_claims"
    assert judge_script.reference_of(extraction) == EINSTEIN and len(extraction["messages"]) == 2
    # the same reference again (another context): no extraction, one judge call
    again = metric.measure(case.model_copy(update={"retrieval_context": ["Einstein developed relativity."]}))
    assert again.score == 0.5 and again.metadata.requests == 1 and len(_extractions(fake_openai)) == 1
    run_sync(metric.judge.aclose())


@pytest.mark.parametrize(
    ("first", "second", "falls_back", "problem"),
    [
        ([], [], True, "no claims"),
        (["Bananas are yellow."], ["The moon is cheese."], True, "not traceable"),
        ([f"Einstein was born {k}." for k in range(4)], [f"Einstein {k}." for k in range(5)], True, "more than 3x"),
        ("I cannot do that.", "still prose", True, "reply is not JSON"),
        ([], ["Einstein was born in 1879.", "Einstein developed relativity."], False, "no claims"),
    ],
)
def test_bad_extraction_is_retried_once_then_falls_back_to_sentences(fake_openai, first, second, falls_back, problem):
    fake_openai.set_responder(judge_script.claims_responder(lambda ref, retry: second if retry else first))
    metric = _metric(fake_openai)
    case = RecallCase(
        expected_output=EINSTEIN, retrieval_context=["Einstein was born in 1879 and developed relativity."]
    )
    try:
        result = metric.measure(case)
        metric.measure(case)
    finally:
        run_sync(metric.judge.aclose())
    extractions = _extractions(fake_openai)
    assert len(extractions) == 2 and judge_script.is_retry(extractions[1])  # the second measure: none
    assert problem in extractions[1]["messages"][-1]["content"]  # the retry says what was wrong
    statements = [v.statement for v in result.verdicts]
    if falls_back:
        assert statements == [EINSTEIN]  # the sentence
        assert any("scored on sentences" in f and problem in f for f in result.metadata.flags)
    else:
        assert statements == second and any("retry" in f for f in result.metadata.flags)
    assert result.metadata.requests == 3  # two extractions, one judge call
    # the outcome is kept, fallback included: the same reference cost no extraction the second time
    assert len(_extractions(fake_openai)) == 2


def test_lexical_judge_cannot_extract_claims() -> None:
    with pytest.raises(ConfigError, match="needs a claim extractor"):
        ContextualRecall(units="claims")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"judge": "lexical"}, "--units claims needs an LLM to extract the claims"),
        ({"judge": "openai", "metric": "context_coverage"}, "applies to contextual_recall only"),
    ],
)
def test_claims_mode_refused_before_any_call(fake_openai, monkeypatch, tmp_path, kw, message) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    data = tmp_path / "d.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"expected_output": "A.", "retrieval_context": ["a"], "actual_output": "A"}]), data
    )
    params = RunParams(dataset_uri=str(data), output_uri=str(tmp_path / "o"), base_url=fake_openai.base_url,
                       units="claims", **kw)  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        steps.check_run(params)
    assert fake_openai.requests == [] and not (tmp_path / "o").exists()


def test_cli_lexical_claims_is_one_error_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"expected_output": "A.", "retrieval_context": ["a"]}]), data)
    result = CliRunner().invoke(app, ["run", str(data), "-o", str(tmp_path / "o"), "--units", "claims"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--units claims needs an LLM" in errors[0]


# -- the pipeline: two nights, claims cached, stored, like-for-like ---------------------------------------------


def claim_rows(n: int, references: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    refs = []
    for _ in range(references):
        sentences = []
        for _ in range(rng.randint(1, 2)):
            a, b = rng.sample(WORDS, 3), rng.sample(WORDS, 2)
            sentences.append(f"{' '.join(a).capitalize()} and {' '.join(b)}.")
        refs.append(" ".join(sentences))
    rows = []
    for i in range(n):
        ref = refs[i % references]
        claims = judge_script.split_claims(ref)
        chunks = [c.rstrip(".").lower() + " here" for c in claims if rng.random() < 0.6] + ["filler text"]
        rows.append({"row_id": f"r{i:03d}", "question": f"q{i}", "ground_truth": ref, "contexts": chunks})
    return rows


def expected_claims_score(row: dict) -> float:
    return judge_script.expected_score(
        "contextual_recall", judge_script.split_claims(row["ground_truth"]), row["contexts"]
    )


def test_two_nights_in_claims_mode(prefect_harness, fake_openai, monkeypatch, tmp_path) -> None:
    from recall_tasks.pipeline.flow import recall_benchmark

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.claims_responder())
    rows = claim_rows(24, references=6)
    data = tmp_path / "data" / "eval.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = tmp_path / "out"
    common = {"dataset_uri": str(data), "output_uri": str(out), "judge": "openai", "base_url": fake_openai.base_url,
              "chunk_size": 5}  # fmt: skip
    first = recall_benchmark(RunParams(**common, units="claims"))
    extractions = len(_extractions(fake_openai))
    judged = len(fake_openai.chat_requests) - extractions
    assert (extractions, judged) == (6, 24)  # one extraction per distinct reference, one judge call per row
    assert first["requests"] == 30
    results = DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()
    for r in results:
        row = next(x for x in rows if x["row_id"] == r["row_id"])
        claims = judge_script.split_claims(row["ground_truth"])
        assert [v["statement"] for v in r["verdicts"]] == claims and r["sentence_count"] == len(claims)
        assert r["score"] == pytest.approx(expected_claims_score(row))
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    assert {r["units"] for r in runs} == {"claims"}
    assert any(p.name.endswith(".parquet") for p in (out / "cache" / "claims").iterdir())

    # the second night: the index was rebuilt (new contexts): one judge call per row, no extraction
    fake_openai.reset()
    fake_openai.set_responder(judge_script.claims_responder())
    moved = [{**r, "contexts": ["new filler", *r["contexts"]]} for r in rows]
    pq.write_table(pa.Table.from_pylist(moved), data)
    second = recall_benchmark(RunParams(**common, units="claims"))
    assert len(_extractions(fake_openai)) == 0 and len(fake_openai.chat_requests) == 24
    assert second["requests"] == 24 and second["mean_score"] == pytest.approx(first["mean_score"])
    assert second["comparison"]["verdict"] == "unchanged"

    # a sentence run of the same dataset: its verdicts are not the claims' (no row-cache hit) and not comparable
    fake_openai.reset()
    fake_openai.set_responder(judge_script.claims_responder())
    third = recall_benchmark(RunParams(**common))
    assert len(fake_openai.chat_requests) == 24 and len(_extractions(fake_openai)) == 0
    assert third["comparison"]["verdict"] == "incomparable"
    assert "units differs (current 'sentences', baseline 'claims')" in third["comparison"]["reason"]


# -- every paid request is in the runs table, whatever the outcome --------------------------------------------


def _billed(fake_openai) -> tuple[int, int, int, float]:
    """What the fake server was asked and billed: chat POSTs, prompt and completion tokens, USD at gpt-4o-mini."""
    from recall_tasks.judges.pricing import PRICES_PER_MTOK

    posts = len(fake_openai.chat_requests)
    prompt = sum(p for p, _ in fake_openai.usage_reported)
    completion = sum(c for _, c in fake_openai.usage_reported)
    price = PRICES_PER_MTOK["gpt-4o-mini"]
    return posts, prompt, completion, (prompt * price[0] + completion * price[1]) / 1e6


def _recorded(out) -> tuple[int, int, int, float]:
    (run,) = [r for r in DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist() if r["segment_column"] is None]
    return run["requests"], run["prompt_tokens"], run["completion_tokens"], run["cost_usd"]


def _truncated_twice(body: dict) -> dict | str:
    if judge_script.is_extraction(body):
        return json.dumps({"claims": judge_script.split_claims(judge_script.reference_of(body))})
    return {"content": '{"verdicts": [', "finish_reason": "length"}  # judge calls: truncated, then again


def _retry_fails(fake_openai):
    """Every extraction is unusable (no claims), its retry answered 500 past the retries: a row error."""

    def answer(body: dict) -> dict | str:
        if judge_script.is_extraction(body):
            if judge_script.is_retry(body):
                return {"status": 500}
            return json.dumps({"claims": []})
        return judge_script.responder(body)

    return answer


@pytest.mark.parametrize(
    ("case", "extra", "status"),
    [
        ("budget", {"max_requests": 12}, "budget_exhausted"),
        ("judge-truncated", {"max_error_rate": 1.0}, "completed"),
        ("retry-of-extraction-fails", {"max_retries": 1}, "failed"),
        ("completed", {}, "completed"),
    ],
)
def test_every_paid_request_is_counted_in_runs(prefect_harness, fake_openai, monkeypatch, tmp_path, case, extra,
                                               status) -> None:  # fmt: skip
    """The runs row's requests, tokens and cost are what the judge endpoint was sent and billed: claim extractions
    of rows never judged (``--max-requests``: 12 POSTs recorded as 2 before), the tokens of a judge reply
    truncated twice and of an extraction whose retry failed (recorded as 0 before), retries included."""
    from recall_tasks.pipeline.flow import recall_benchmark

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    responder = {"judge-truncated": _truncated_twice, "retry-of-extraction-fails": _retry_fails(fake_openai)}.get(
        case, judge_script.claims_responder()
    )
    fake_openai.set_responder(responder)
    if case == "completed":
        fake_openai.enqueue(Status(500), Status(429, headers={"retry-after": "0"}))  # two retried attempts
    rows = claim_rows(10, references=10)
    data = tmp_path / "data" / "eval.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = tmp_path / "out"
    params = RunParams(dataset_uri=str(data), output_uri=str(out), judge="openai", base_url=fake_openai.base_url,
                       units="claims", chunk_size=5, max_concurrency=4, **extra)  # fmt: skip
    try:
        summary = recall_benchmark(params)
    except (RunFailed, BudgetExhausted) as exc:
        summary = exc.summary
    assert summary["status"] == status, summary
    posts, prompt, completion, cost = _billed(fake_openai)
    requests, prompt_tokens, completion_tokens, cost_usd = _recorded(out)
    assert posts > 10 and requests == posts, (requests, posts)
    assert (prompt_tokens, completion_tokens) == (prompt, completion)
    assert cost_usd == pytest.approx(cost)
