"""Id-based retrieval metrics through the pipeline (issue 41 items 1-4): inputs, ``--metric retrieval_ids`` (no judge,
no request), the id metrics of a judged run at no extra request, the tables in every format, the regression
verdicts."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.test_pipeline import KEY, make_rows

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


def retrieval_file(path: Path, rows: list[dict[str, Any]]) -> str:
    """What an index build writes: row ids and the retrieved ids (no contexts: the dataset's stay)."""
    return write(path, [{"row_id": r["row_id"], "retrieved_context_ids": r["retrieved_context_ids"]} for r in rows])


def test_a_night_that_lost_10_percent_of_the_relevant_documents_reads_regressed_in_history(
    prefect_harness, fake_openai, tmp_path
):
    """Issue 41's done-means: the index lost 10 % of the relevant documents; ``history`` says ``regressed`` on
    recall@10, and no judge request was sent."""
    full, lost = id_rows(120, ints=True), id_rows(120, ints=True, lose=0.1)
    data = write(tmp_path / "data" / "eval.parquet", [{k: v for k, v in r.items() if k != "retrieved_context_ids"}
                                                       for r in full])  # fmt: skip
    out = str(tmp_path / "out")
    common = {"dataset_uri": data, "output_uri": out, "metric": "retrieval_ids", "chunk_size": 50}
    first = recall_benchmark(
        RunParams(**common, retrieval_uri=retrieval_file(tmp_path / "v1.parquet", full), label="v1")
    )
    second = recall_benchmark(
        RunParams(**common, retrieval_uri=retrieval_file(tmp_path / "v2.parquet", lost), label="v2")
    )
    assert fake_openai.requests == []
    assert first["mean_score"] == pytest.approx(1.0) and second["mean_score"] == pytest.approx(recall_at(lost, 10))
    assert second["comparison"]["verdict"] == "regressed"  # type: ignore[typeddict-item]
    got = cli("history", "-o", out, "--output-format", "json")
    assert got.exit_code == 0, got.output
    records = {r["label"]: r for r in map(json.loads, got.output.splitlines())}
    assert records["v2"]["verdict"] == "regressed" and records["v2"]["baseline_run_id"] == first["run_id"]
    comparisons = ResultStore(out, StorageConfig.from_options(), "delta").read_table("comparisons")
    rows = comparisons.to_table().to_pylist()  # type: ignore[union-attr]
    by_metric = {r["metric"]: r for r in rows if r["segment_column"] is None}
    assert by_metric["retrieval_ids"]["verdict"] == "regressed" and by_metric["recall@10"]["verdict"] == "regressed"
    assert by_metric["recall@10"]["ci_high"] < 0 < 1 and by_metric["recall@1"]["metric"] == "recall@1"
    assert {r["comparison_id"] for r in rows} == {f"{second['run_id']}__{first['run_id']}"}
    report = (Path(out) / "reports" / f"{second['run_id']}.html").read_text()  # the run's HTML report
    assert "Recall@k from document ids" in report and "k=10" in report and "baseline v1" in report
    gone = {r["row_id"]: [str(d) for d in r["reference_context_ids"] if d not in r["retrieved_context_ids"]]
            for r in lost}  # fmt: skip
    table = report.split("Rows that lost relevant documents", 1)[1]
    listed = [(row_id, ids) for row_id, ids in gone.items() if ids and f"<code>{row_id}</code>" in table]
    assert len(listed) == min(20, sum(1 for ids in gone.values() if ids))
    assert all(f"<code>{row_id}</code></td><td>{', '.join(ids)}</td>" in table for row_id, ids in listed)
    got = cli("history", "-o", out, "--metric", "hit_rate@1", "--output-format", "json")
    assert got.exit_code == 0, got.output
    hits = {r["label"]: r for r in map(json.loads, got.output.splitlines())}
    assert hits["v2"]["verdict"] == by_metric["hit_rate@1"]["verdict"]
    assert hits["v2"]["mean_score"] == pytest.approx(second["id_metrics"]["hit_rate@1"])  # type: ignore[index]
    assert hits["v1"]["verdict"] is None and hits["v1"]["mean_score"] == first["id_metrics"]["hit_rate@1"]  # type: ignore[index]
    for sql in documented_queries():  # docs/warehouse.md's query per id metric runs as written
        got = cli("query", sql, "-o", out, "--output-format", "json")
        assert got.exit_code == 0, (sql, got.output)
        answer = [json.loads(line) for line in got.output.splitlines()]
        assert answer or "mrr@10" in sql, sql  # no row lost every relevant document of its top 10: no answer
        assert all(
            v is not None
            for r in answer
            for k, v in r.items()
            if k not in ("segment_column", "segment_value", "reason")
        )


def documented_queries() -> list[str]:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "warehouse.md").read_text()
    section = doc.split("\n## Id-based retrieval metrics\n", 1)[1].split("\n## ", 1)[0]
    queries = [block.split("\n", 1)[1].strip() for block in re.findall(r"```sql\n(.*?)```", section, re.S)]
    assert [m for q in queries for m in re.findall(r"'(\w+@\d+)'", q)[:1]] == [
        "recall@10", "precision@5", "hit_rate@1", "mrr@10", "ndcg@10"
    ]  # fmt: skip
    return queries


def test_a_judged_run_gets_the_id_metrics_at_no_extra_request_and_says_which_moved(
    prefect_harness, fake_openai, monkeypatch, tmp_path
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    full, lost = id_rows(60, ints=True), id_rows(60, ints=True, lose=0.3)
    data = write(tmp_path / "data" / "eval.parquet", full)
    out = str(tmp_path / "out")
    common = {"dataset_uri": data, "output_uri": out, "judge": "openai", "base_url": fake_openai.base_url,
              "chunk_size": 25}  # fmt: skip
    night1 = recall_benchmark(RunParams(**common, label="n1"))
    assert night1["requests"] == 60 and len(fake_openai.chat_requests) == 60  # one per row, none for the ids
    assert night1["id_metrics"] is not None and night1["id_metrics"]["recall@10"] == pytest.approx(1.0)
    assert night1["verdict_metric"] == "contextual_recall"
    # the index lost documents but the contexts the judge reads are the same: judged unchanged, id recall regressed
    index = retrieval_file(tmp_path / "v2.parquet", lost)
    night2 = recall_benchmark(RunParams(**common, label="n2", retrieval_uri=index))
    assert len(fake_openai.chat_requests) == 60  # the row cache: nothing judged again
    comparison = night2["comparison"]  # type: ignore[typeddict-item]
    assert comparison["verdict"] == "unchanged"
    assert any("id-based recall@10 regressed" in w for w in comparison["warnings"])
    # the judge changed (it now finds nothing), the ids did not: judged regressed, id recall unchanged
    fake_openai.set_responder(lambda body: judge_script.responder(body).replace('"yes"', '"no"'))
    night3 = recall_benchmark(RunParams(**common, label="n3", retrieval_uri=index, cache=False))
    comparison = night3["comparison"]  # type: ignore[typeddict-item]
    assert comparison["verdict"] == "regressed"
    assert "id-based recall is unchanged; the judge may have changed (run with --canary)" in comparison["warnings"]
    rows = ResultStore(out, StorageConfig.from_options(), "delta").read_table("comparisons").to_table().to_pylist()  # type: ignore[union-attr]
    mine = {r["metric"]: r for r in rows if r["current_run_id"] == night3["run_id"] and r["segment_column"] is None}
    assert mine["contextual_recall"]["reason"].startswith("id-based recall is unchanged")
    assert mine["recall@10"]["verdict"] == "unchanged" and mine["recall@10"]["mean_delta"] == 0.0


def refusal(tmp_path: Path, rows: list[dict[str, Any]], **kw: Any) -> str:
    """The one error ``check_run`` raises for a run of ``rows`` (before any write: the output stays absent)."""
    from recall_tasks.pipeline.steps import check_run

    data = write(tmp_path / "data" / "eval.parquet", rows)
    out = tmp_path / "out"
    kw.setdefault("metric", "retrieval_ids")
    with pytest.raises(ConfigError) as caught:
        check_run(RunParams(dataset_uri=data, output_uri=str(out), **kw), contact=False)
    assert not out.exists()
    return str(caught.value)


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        (
            "retrieved_context_ids",
            [1.5, 2.0],
            "expected list<string> or list<int64> (document ids), found list<double>",
        ),
        ("retrieved_context_ids", ["a", None], "an id is null"),
        ("reference_context_ids", ["", "b"], "an id is an empty string"),
        ("reference_context_relevance", [1, -1], "negative"),
        ("reference_context_relevance", [1.5, 1.0], "row 3"),
        ("reference_context_relevance", [1], "row 3"),
    ],
)
def test_a_bad_id_value_is_one_error_naming_file_row_and_column_before_any_write(tmp_path, column, value, expected):
    rows = id_rows(5, ints=column == "retrieved_context_ids" and isinstance(value[0], float))
    for row in rows:
        row["reference_context_ids"] = row["reference_context_ids"][:2]
        row["reference_context_relevance"] = [1, 1]
    rows[3][column] = value
    if isinstance(value[0], float):  # a whole column of floats (Parquet has one type per column)
        for row in rows:
            row[column] = [float(v) for v in row[column]] if row is not rows[3] else value
    message = refusal(tmp_path, rows)
    assert expected in message and "eval.parquet" in message and f"column '{column}'" in message


def test_run_options_of_the_id_metrics_are_checked_before_any_write(tmp_path):
    rows = id_rows(5)
    assert "--k '0'" in refusal(tmp_path / "k", rows, k="0")
    assert "--verdict-metric recall@20: its k is not one of --k" in refusal(
        tmp_path / "v", rows, verdict_metric="recall@20"
    )
    no_reference = [{k: v for k, v in r.items() if k != "reference_context_ids"} for r in rows]
    assert "needs the relevant document ids" in refusal(tmp_path / "r", no_reference)
    no_retrieved = [{k: v for k, v in r.items() if k != "retrieved_context_ids"} for r in rows]
    assert "needs the retrieved document ids" in refusal(tmp_path / "d", no_retrieved)
    assert "does not match the chunk-to-document pattern" in refusal(tmp_path / "p", rows, id_pattern="^(.+)##")
    with pytest.raises(ValueError, match="exactly one group"):
        RunParams(dataset_uri="x", id_pattern="(a)(b)")
    with pytest.raises(ValueError, match="--canary needs a judge"):
        RunParams(dataset_uri="x", metric="retrieval_ids", canary="labels.parquet")


def test_the_cli_refuses_a_bad_id_with_one_error_line_and_writes_nothing(tmp_path):
    rows = id_rows(5)
    rows[2]["retrieved_context_ids"] = ["doc-1", None]
    data = write(tmp_path / "data" / "eval.parquet", rows)
    out = tmp_path / "out"
    got = cli("run", data, "-o", str(out), "--metric", "retrieval_ids", "--k", "1,3", "--verdict-metric", "ndcg@3")
    assert got.exit_code == 2, got.output
    lines = [line for line in got.output.splitlines() if line.strip() and not line.startswith("judge: none")]
    assert len(lines) == 1 and lines[0].startswith("error:") and "an id is null" in lines[0], got.output
    assert "eval.parquet" in lines[0] and "row 2" in lines[0] and "'retrieved_context_ids'" in lines[0]
    assert not out.exists()


def test_a_thousand_id_list_and_integer_ids_score_like_their_strings(tmp_path):
    """Ids compare as strings (``7`` and ``"7"`` are one document); a 1,000-id list is an ordinary row."""
    from recall_tasks.io.blocks import iter_blocks
    from recall_tasks.pipeline import ids_step
    from recall_tasks.pipeline.steps import check_run

    rows = id_rows(4, ints=True)
    rows[0]["retrieved_context_ids"] = list(range(5000, 6000))
    rows[0]["reference_context_ids"] = [5999, 7]
    data = write(tmp_path / "data" / "eval.parquet", rows)
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), metric="retrieval_ids", k="1000",
                       verdict_metric="mrr@1000")  # fmt: skip
    checked = check_run(params, contact=False)
    setup = ids_step.build_setup(params, checked.dataset, checked.storage, None, False)
    assert setup is not None

    block = next(iter_blocks(checked.dataset, 10))
    found = ids_step.block_ids(setup, block)
    assert found.retrieved[0].as_py()[-1] == "5999" and found.relevant[0].as_py() == ["5999", "7"]
    assert found.values.column("recall@1000")[0].as_py() == 0.5
    assert found.values.column("mrr@1000")[0].as_py() == pytest.approx(1 / 1000)


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "parquet"])
def test_tables_written_before_the_id_columns_take_them_and_maintain_keeps_them(
    prefect_harness, fake_openai, monkeypatch, tmp_path, fmt
):
    """A run recorded with the schema before issue 41, then a retrieval_ids run: both read back (the older run's id
    columns null), before and after ``maintain``, through ``recall-bench query``'s DuckDB."""
    from recall_tasks.io import results as results_module
    from recall_tasks.io.maintenance import maintain
    from recall_tasks.io.schemas import ID_RUN_FIELDS, RUN_FIELDS
    from tests.test_maintain import night

    out = str(tmp_path / "out")
    store = ResultStore(out, StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    old = pa.schema([f for f in RUN_FIELDS if f.name not in {g.name for g in ID_RUN_FIELDS}])
    with monkeypatch.context() as patch:
        patch.setattr(results_module, "RUN_SCHEMA", old)
        old_run, _ = night(store, 0)
    assert "id_metrics" not in store.read_table("runs").schema.names  # type: ignore[union-attr]
    data = write(tmp_path / "data" / "eval.parquet", id_rows(12, ints=True))
    new = recall_benchmark(RunParams(dataset_uri=data, output_uri=out, metric="retrieval_ids", format=fmt, k="5,10"))
    sql = (
        "SELECT r.run_id, r.id_metrics['recall@10'] AS run_recall, max(x.id_metrics['recall@5']) AS row_recall, "
        "count(x.row_id) AS n FROM runs r JOIN results x USING (run_id) WHERE r.segment_column IS NULL "
        "GROUP BY ALL ORDER BY r.run_id"
    )

    def query() -> list[dict[str, Any]]:
        got = cli("query", sql, "-o", out, "--output-format", "json")
        assert got.exit_code == 0, got.output
        return [json.loads(line) for line in got.output.splitlines()]

    expected = [
        {"run_id": new["run_id"], "run_recall": 1.0, "row_recall": 1.0, "n": 12},
        {"run_id": old_run, "run_recall": None, "row_recall": None, "n": 3},
    ]
    assert sorted(query(), key=lambda r: r["n"], reverse=True) == expected
    maintain(ResultStore(out, StorageConfig.from_options(), fmt), keep_days=7)  # type: ignore[arg-type]
    assert sorted(query(), key=lambda r: r["n"], reverse=True) == expected


def test_qrels_on_s3_give_the_relevant_ids_and_grades_joined_by_row_id(
    prefect_harness, fake_openai, s3_server, s3_bucket, monkeypatch, tmp_path
):
    """``--qrels`` (TREC text on S3) replaces the dataset's relevant ids; graded relevance reaches nDCG; a row the
    qrels do not judge is not assessed; qrels naming no row of the dataset are refused before any work."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    rows = id_rows(20, ints=True)
    for row in rows:
        row["retrieved_context_ids"] = [row["reference_context_ids"][1], 5, row["reference_context_ids"][0]]
    lines = ["# query iteration doc relevance"]
    for row in rows[1:]:  # row 0: no judgements
        first, second = row["reference_context_ids"][:2]
        lines += [f"{row['row_id']} 0 {first} 2", f"{row['row_id']} 0 {second} 1", f"{row['row_id']} 0 999 0"]
    client = s3_server.client()
    local = write(
        tmp_path / "eval.parquet", [{k: v for k, v in r.items() if k != "reference_context_ids"} for r in rows]
    )
    client.upload_file(local, s3_bucket, "data/eval.parquet")
    client.put_object(Bucket=s3_bucket, Key="qrels.txt", Body="\n".join(lines).encode())
    base = f"s3://{s3_bucket}"
    summary = recall_benchmark(
        RunParams(
            dataset_uri=f"{base}/data/eval.parquet",
            output_uri=f"{base}/out",
            metric="retrieval_ids",
            qrels_uri=f"{base}/qrels.txt",
            k="1,3",
            verdict_metric="ndcg@3",
        )  # fmt: skip
    )
    assert fake_openai.requests == [] and summary["id_rows"] == 19 and summary["skipped"] == 1
    import math

    ideal = 2 + 1 / math.log2(3)
    got = 1 / math.log2(2) * 1 + 2 / math.log2(4)  # the grade-1 document first, then a miss, then the grade-2 one
    assert summary["mean_score"] == pytest.approx(got / ideal)
    means = summary["id_metrics"]
    assert means is not None and means["recall@3"] == 1.0 and means["precision@1"] == 1.0
    client.put_object(Bucket=s3_bucket, Key="other.txt", Body=b"q-elsewhere 0 d1 1\n")
    with pytest.raises(ConfigError, match="0 of 20 row ids found"):
        recall_benchmark(
            RunParams(
                dataset_uri=f"{base}/data/eval.parquet",
                output_uri=f"{base}/out2",
                metric="retrieval_ids",
                qrels_uri=f"{base}/other.txt",
            )  # fmt: skip
        )
    assert "Contents" not in client.list_objects_v2(Bucket=s3_bucket, Prefix="out2")


def retriever_with_ids(questions: list[str]) -> list[dict[str, Any]]:
    """A ``--retriever`` returning ``{contexts, ids}`` per question: the ids of ``id_rows`` (by the question's item)."""
    rows = {row["question"]: row for row in id_rows(10)}
    return [{"contexts": rows[q]["contexts"], "ids": rows[q]["retrieved_context_ids"]} for q in questions]


def test_a_retriever_returning_contexts_and_ids_feeds_the_id_metrics(prefect_harness, fake_openai, tmp_path):
    rows = [{k: v for k, v in r.items() if k not in ("retrieved_context_ids", "contexts")} for r in id_rows(10)]
    data = write(tmp_path / "data" / "eval.parquet", rows)
    summary = recall_benchmark(
        RunParams(
            dataset_uri=data,
            output_uri=str(tmp_path / "out"),
            retriever=f"{__name__}:retriever_with_ids",
            id_pattern="^(.+)::",
        )  # fmt: skip
    )
    assert fake_openai.requests == [] and summary["scored"] == 10  # the lexical judge: judged, offline
    assert summary["id_rows"] == 10 and summary["id_metrics"] is not None
    assert summary["id_metrics"]["recall@10"] == pytest.approx(recall_at(id_rows(10), 10))


def test_one_side_of_the_ids_is_kept_with_the_types_a_run_with_both_stores():
    """A judged run whose rows have relevant ids but no retrieved ones computes no id metric; its integer ids are
    stored as strings all the same, so the ``results`` table keeps one type per column across runs."""
    from recall_tasks.pipeline.ids_step import _as_stored

    table = pa.table({"row_id": ["a"], "reference_context_ids": [[7, 8]], "reference_context_relevance": [[2.0, 1.0]]})
    stored = _as_stored(table)
    assert stored.column("reference_context_ids").to_pylist() == [["7", "8"]]
    assert stored.schema.field("reference_context_relevance").type == pa.list_(pa.int64())


def test_a_retrieval_ids_run_on_worker_processes_scores_as_in_threads(prefect_harness, fake_openai, tmp_path):
    rows = id_rows(40)
    data = write(tmp_path / "data" / "eval.parquet", rows)
    common = {"dataset_uri": data, "metric": "retrieval_ids", "id_pattern": "^(.+)::", "chunk_size": 10}
    threads = recall_benchmark(RunParams(**common, output_uri=str(tmp_path / "a")))
    processes = recall_benchmark(RunParams(**common, output_uri=str(tmp_path / "b"), task_runner="processes",
                                           workers=2))  # fmt: skip
    assert fake_openai.requests == []
    assert processes["id_metrics"] == threads["id_metrics"] and processes["mean_score"] == threads["mean_score"]
    assert threads["mean_score"] == pytest.approx(recall_at(rows, 10))
