"""Id-based retrieval metrics through the pipeline (issue 41 items 1-4): inputs, ``--metric retrieval_ids`` (no judge,
no request), the id metrics of a judged run at no extra request, the tables in every format, the regression
verdicts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.config import RunParams
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline.flow import recall_benchmark
from tests.test_pipeline import make_rows

pytestmark = pytest.mark.concurrency  # Prefect's test server, the fake OpenAI server, SeaweedFS


def id_rows(n: int, *, lose: float = 0.0, seed: int = 3, ints: bool = False) -> list[dict[str, Any]]:
    """Rows with ids: each has 2-4 relevant documents; the retriever returns 10 ids (the relevant ones among them,
    unless ``lose`` of them are lost, replaced by filler ids)."""
    rng = random.Random(seed)
    lost = random.Random(seed + 1)
    rows = make_rows(n, seed=seed)
    for i, row in enumerate(rows):
        relevant = [1000 * i + j for j in range(rng.randint(2, 4))]
        kept = [d for d in relevant if lost.random() >= lose]
        filler = [900_000 + 100 * i + j for j in range(10 - len(kept))]
        ranked = kept + filler
        rng.shuffle(ranked)
        row["retrieved_context_ids"] = ranked if ints else [f"doc-{d}::chunk-0" for d in ranked]
        row["reference_context_ids"] = relevant if ints else [f"doc-{d}" for d in relevant]
    return rows


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def recall_at(rows: list[dict[str, Any]], k: int, pattern: str = "::") -> float:
    values = []
    for row in rows:
        retrieved = [str(d).split(pattern)[0] for d in row["retrieved_context_ids"]][:k]
        relevant = {str(d) for d in row["reference_context_ids"]}
        values.append(len(relevant & set(retrieved)) / len(relevant))
    return sum(values) / len(values)


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.mark.parametrize("fmt", ["delta", "parquet", "iceberg"])
def test_retrieval_ids_run_scores_from_ids_with_no_request(prefect_harness, fake_openai, tmp_path, fmt):
    rows = id_rows(30)
    rows[4]["reference_context_ids"] = []  # not assessed
    data = write(tmp_path / "data" / "eval.parquet", rows)
    out = str(tmp_path / "out")
    summary = recall_benchmark(
        RunParams(
            dataset_uri=data,
            output_uri=out,
            metric="retrieval_ids",
            id_pattern="^(.+)::",
            format=fmt,
            segment_by=["category"],
            chunk_size=7,
        )  # fmt: skip
    )
    assert fake_openai.requests == []
    assessed = [r for i, r in enumerate(rows) if i != 4]
    assert summary["rows"] == 30 and summary["scored"] == 29 and summary["skipped"] == 1
    assert summary["requests"] == 0 and summary["judge_model"] == "none"
    assert summary["mean_score"] == pytest.approx(recall_at(assessed, 10))
    assert summary["verdict_metric"] == "recall@10" and summary["id_rows"] == 29
    means = summary["id_metrics"]
    assert means is not None
    assert means["recall@10"] == pytest.approx(recall_at(assessed, 10))
    assert means["recall@5"] == pytest.approx(recall_at(assessed, 5))
    assert set(means) == {f"{m}@{k}" for m in ("recall", "precision", "hit_rate", "mrr", "ndcg") for k in (1, 5, 10)}
    low, high = summary["id_metrics_low"], summary["id_metrics_high"]
    assert low is not None and high is not None and low["recall@5"] <= means["recall@5"] <= high["recall@5"]
    store = ResultStore(out, StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    results = store.read_table("results").to_table().to_pylist()  # type: ignore[union-attr]
    by_id = {r["row_id"]: r for r in results}
    assert by_id[rows[4]["row_id"]]["id_metrics"] is None and by_id[rows[4]["row_id"]]["skipped"]
    first = by_id[rows[0]["row_id"]]
    assert dict(first["id_metrics"])["recall@10"] == 1.0
    assert first["retrieved_context_ids"][0].startswith("doc-") and "::" not in first["retrieved_context_ids"][0]
    runs = store.read_table("runs").to_table().to_pylist()  # type: ignore[union-attr]
    segments = [r for r in runs if r["segment_column"] == "category"]
    assert segments and all(r["id_metrics"] is not None for r in segments)
    assert sum(r["id_rows"] for r in segments) == 29
