"""Context precision from the recall verdicts (no extra judge call): worked examples, the metric, the pipeline."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks import ContextualRecall, RecallCase, split_sentences
from recall_tasks.analysis.regression import compare_runs
from recall_tasks.config import RunParams
from recall_tasks.judges.base import JudgeResponse, JudgeVerdict
from recall_tasks.metrics.precision import chunk_use
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.test_pipeline import KEY, make_rows


@pytest.mark.parametrize(
    ("cited", "retrieved", "precision", "used", "first"),
    [
        ([[2], [2], [4]], 5, (1 / 2 + 2 / 4) / 2, 2, 2),  # chunk 2 supports two sentences: counted once
        ([[1], [2]], 3, (1 / 1 + 2 / 2) / 2, 2, 1),  # supporting chunks ranked first: 1.0
        ([[3]], 3, 1 / 3, 1, 3),
        ([[1, 3], [3]], 4, (1 / 1 + 2 / 3) / 2, 2, 1),  # one sentence citing two chunks
        ([], 4, 0.0, 0, None),  # no relevant chunk
        ([[0], [9]], 4, 0.0, 0, None),  # ids outside the retrieved range are ignored
    ],
)
def test_worked_examples(cited, retrieved, precision, used, first) -> None:
    use = chunk_use(cited, retrieved)
    assert use.context_precision == pytest.approx(precision)
    assert (use.chunks_used, use.first_relevant_rank) == (used, first)


class Scripted:
    """A judge that answers fixed verdicts (the metric's own code computes the figures from them)."""

    model = "scripted"
    prompt_version = "s1"

    def __init__(self, verdicts: list[tuple[str, list[int]]]) -> None:
        self.verdicts = verdicts

    def config(self) -> dict:
        return {"judge": "scripted"}

    async def judge(self, request):
        verdicts = [
            JudgeVerdict(id=i, verdict=v, reason="", chunk_ids=ids) for i, (v, ids) in enumerate(self.verdicts, 1)
        ]
        return JudgeResponse(verdicts=verdicts, summary="", model=self.model, prompt_version=self.prompt_version)


def test_the_metric_computes_precision_from_its_own_verdicts() -> None:
    case = RecallCase(
        expected_output="A one. B two. C three.",
        retrieval_context=["noise", "supports A and B", "noise", "supports C"],
    )
    result = ContextualRecall(judge=Scripted([("yes", [2]), ("yes", [2]), ("yes", [4])])).measure(case)
    assert result.score == 1.0
    assert result.metadata.context_precision == pytest.approx(0.5)
    assert result.metadata.chunks_used == 2 and result.metadata.first_relevant_rank == 2
    none = ContextualRecall(judge=Scripted([("no", []), ("no", []), ("no", [])])).measure(case)
    assert none.score == 0.0 and none.metadata.context_precision == 0.0 and none.metadata.first_relevant_rank is None


def test_pipeline_columns_aggregates_and_comparison(prefect_harness, fake_openai, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    rows = make_rows(30, seed=23)
    data = tmp_path / "data" / "eval.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = str(tmp_path / "out")
    params = {"dataset_uri": str(data), "output_uri": out, "judge": "openai", "base_url": fake_openai.base_url}
    summary = recall_benchmark(RunParams(**params))
    calls = len(fake_openai.chat_requests)
    assert calls == len(rows)  # one call per row: precision costs nothing extra

    def expected(row: dict) -> tuple[float, int, int | None]:
        verdicts = judge_script.truth("contextual_recall", split_sentences(row["ground_truth"]), row["contexts"])
        use = chunk_use([ids for v, ids in verdicts if v == "yes"], len(row["contexts"]))
        return use.context_precision, use.chunks_used, use.first_relevant_rank

    got = DeltaTable(f"{out}/results").to_pyarrow_table().to_pylist()
    for r in got:
        want = expected(next(x for x in rows if x["row_id"] == r["row_id"]))
        assert (r["context_precision"], r["chunks_used"], r["first_relevant_rank"]) == pytest.approx(want)
    assert summary["mean_context_precision"] == pytest.approx(sum(expected(r)[0] for r in rows) / len(rows))
    rates = [expected(r)[1] / len(r["contexts"]) for r in rows]
    assert summary["chunk_use_rate"] == pytest.approx(sum(rates) / len(rates))
    # a second run with the supporting chunks moved to the end: recall unchanged, precision down
    moved = [
        {**r, "contexts": [c for c in r["contexts"] if "filler" in c] + [c for c in r["contexts"] if "filler" not in c]}
        for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(moved), data)
    second = recall_benchmark(RunParams(**params))
    assert second["mean_score"] == pytest.approx(summary["mean_score"])
    comparison = second["comparison"]
    assert comparison["verdict"] == "unchanged" and comparison["context_precision_delta"] < 0


def test_comparison_precision_delta_over_paired_rows() -> None:
    def table(run: str, precision: list[float | None]) -> pa.Table:
        return pa.table({
            "run_id": [run] * 3, "row_id": ["a", "b", "c"], "score": [1.0, 0.5, 0.0],
            "success": [True, True, False], "context_precision": pa.array(precision, pa.float64()),
        })  # fmt: skip

    cmp = compare_runs(
        table("cur", [0.5, None, 0.25]), table("base", [1.0, 1.0, 0.25]),
        current_run={"run_id": "cur"}, baseline_run={"run_id": "base"},
    )  # fmt: skip
    assert cmp.context_precision_delta == pytest.approx((-0.5 + 0.0) / 2)
    assert cmp.to_rows()[0]["context_precision_delta"] == cmp.context_precision_delta
