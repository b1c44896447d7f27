"""Retrieval at run time: a retriever entrypoint or a retrieval-results file fills the contexts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks.config import RunParams
from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.pipeline.flow import recall_benchmark
from tests import sample_retriever
from tests.test_pipeline import make_rows

ROOT = Path(__file__).resolve().parents[1]


def questions_only(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "contexts"} for r in rows]


def scores(out, run_id: str) -> dict[str, float]:
    table = DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()
    return {r["row_id"]: r["score"] for r in table if r["run_id"] == run_id}


@pytest.mark.parametrize("entrypoint", ["tests.sample_retriever:retrieve", "tests.sample_retriever:aretrieve"])
def test_retriever_fills_contexts(prefect_harness, tmp_path, entrypoint):
    rows = make_rows(30, seed=41)
    sample_retriever.INDEX.clear()
    sample_retriever.INDEX.update({r["question"]: r["contexts"] for r in rows})
    sample_retriever.CALLS.clear()
    data = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(questions_only(rows)), data)
    out = tmp_path / "out"
    summary = recall_benchmark(
        RunParams(dataset_uri=str(data), output_uri=str(out), retriever=entrypoint, chunk_size=8, judge="lexical")
    )
    assert summary["scored"] == 30
    assert sample_retriever.CALLS == [8, 8, 8, 6]  # one call per chunk, in batches
    reference = recall_benchmark(
        RunParams(
            dataset_uri=str(_with_contexts(tmp_path, rows)),
            output_uri=str(out),
            chunk_size=8,
            judge="lexical",
            baseline=None,
        )
    )
    assert scores(out, summary["run_id"]) == scores(out, reference["run_id"])


def _with_contexts(tmp_path, rows):
    path = tmp_path / "full" / "q.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_retrieval_results_joined_by_row_id(prefect_harness, tmp_path):
    rows = make_rows(20, seed=43)
    data = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(questions_only(rows)), data)
    retrieved = tmp_path / "index-v2.parquet"
    shuffled = list(reversed(rows))[:-1]  # one row missing from the new index's results
    pq.write_table(
        pa.table({"row_id": [r["row_id"] for r in shuffled], "retrieved_contexts": [r["contexts"] for r in shuffled]}),
        retrieved,
    )
    out = tmp_path / "out"
    summary = recall_benchmark(
        RunParams(
            dataset_uri=str(data),
            output_uri=str(out),
            retrieval_uri=str(retrieved),
            judge="lexical",
            on_missing="skip",
            index_version="v2",
        )
    )
    assert summary["scored"] == 19 and summary["skipped"] == 1
    got = scores(out, summary["run_id"])
    assert got[rows[0]["row_id"]] is None
    lexical = recall_benchmark(
        RunParams(dataset_uri=str(_with_contexts(tmp_path, rows)), output_uri=str(out), judge="lexical", baseline=None)
    )
    reference = scores(out, lexical["run_id"])
    assert all(got[r["row_id"]] == reference[r["row_id"]] for r in rows[1:])
    assert all(reference[r["row_id"]] is not None for r in rows)


def test_bad_retrievers_are_clear_errors(prefect_harness, tmp_path):
    data = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(questions_only(make_rows(3))), data)
    for spec, message in [
        ("nope", "module:function"),
        ("no_such_module_x:f", "cannot import"),
        ("tests.sample_retriever:missing", "no callable"),
        ("tests.sample_retriever:broken", "returned 1 contexts for 3 questions"),
    ]:
        with pytest.raises(ConfigError, match=message):
            recall_benchmark(RunParams(dataset_uri=str(data), output_uri=str(tmp_path / "out"), retriever=spec))
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["x"], "retrieved_contexts": [["c"]]}), bad)
    with pytest.raises(DatasetError, match="need row_id"):
        recall_benchmark(RunParams(dataset_uri=str(data), output_uri=str(tmp_path / "out"), retrieval_uri=str(bad)))
    assert not (tmp_path / "out" / "results").exists()


def test_dataset_without_contexts_needs_a_source(prefect_harness, tmp_path):
    data = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(questions_only(make_rows(3))), data)
    with pytest.raises(DatasetError, match="no retrieval_context column"):
        recall_benchmark(RunParams(dataset_uri=str(data), output_uri=str(tmp_path / "out")))


def _write_retrieval(path, rows: list[dict]) -> None:
    pq.write_table(
        pa.table({"row_id": [r["row_id"] for r in rows], "retrieved_contexts": [r["contexts"] for r in rows]}), path
    )


def _cli(args: list[str], cwd) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "recall_tasks", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.concurrency
def test_retrieval_file_matching_no_row_id_is_refused_before_judging(prefect_harness, tmp_path):
    """A dataset without row_id has hashed ids an index build cannot know: exit 2, both sides' ids named."""
    rows = make_rows(50, seed=47)
    data = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "row_id"} for r in questions_only(rows)]),
                   data)  # fmt: skip
    retrieved = tmp_path / "index-v2.parquet"
    _write_retrieval(retrieved, rows)
    out = tmp_path / "out"
    done = _cli(["run", str(data), "--output", str(out), "--retrieval-uri", str(retrieved), "--judge", "lexical"],
                tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert f"0 of 50 row ids found in the retrieval file {retrieved}" in errors[0]
    assert repr(rows[0]["row_id"]) in errors[0] and "no row_id column" in errors[0]
    assert not out.exists()
    dry = _cli(["run", str(data), "--output", str(out), "--retrieval-uri", str(retrieved), "--judge", "lexical",
                "--dry-run"], tmp_path)  # fmt: skip
    assert dry.returncode == 2 and "0 of 50 row ids found" in dry.stderr, dry.stdout + dry.stderr


@pytest.mark.concurrency
def test_retrieval_file_missing_some_row_ids_is_a_note_with_the_count(prefect_harness, tmp_path):
    rows = make_rows(10, seed=53)
    data = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist(questions_only(rows)), data)
    retrieved = tmp_path / "index-v2.parquet"
    kept = rows[3:]
    _write_retrieval(retrieved, kept)
    done = _cli(["run", str(data), "--output", str(tmp_path / "out"), "--retrieval-uri", str(retrieved),
                 "--judge", "lexical", "--on-missing", "skip"], tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"7 of 10 row ids found in the retrieval file {retrieved}; the 3 others" in " ".join(done.stderr.split())
    # printed once: the flow logs the CLI's notes again (for deployment runs), which the console filters out
    assert " ".join(done.stderr.split()).count("7 of 10 row ids found") == 1, done.stderr
    assert "--on-missing skip" in done.stderr
    # under --on-missing error (the default) 3 of 10 missing is above --max-error-rate 0.05: the run could only fail
    refused = _cli(["run", str(data), "--output", str(tmp_path / "out2"), "--retrieval-uri", str(retrieved),
                    "--judge", "lexical"], tmp_path)  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "7 of 10 row ids found" in error and "more than --max-error-rate 0.05" in error, error
    assert not (tmp_path / "out2").exists()
    allowed = _cli(["run", str(data), "--output", str(tmp_path / "out3"), "--retrieval-uri", str(retrieved),
                    "--judge", "lexical", "--max-error-rate", "0.5"], tmp_path)  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr  # 3 errors of 10: within 0.5
    assert "follow --on-missing error" in " ".join(allowed.stderr.split())
