"""Verdicts you can trust, end to end through the CLI with real components (SeaweedFS, the fake OpenAI server,
Prefect's test server): row identity across index versions, incomparable runs, failed runs and their exit
code, and every check that must stop a run before it spends anything.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.io.datasets import ROW_IDENTITY, open_dataset
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from tests import judge_script
from tests.fake_openai import Status
from tests.test_pipeline import KEY, make_rows
from tests.test_tracking import degrade


def ragas_rows(n: int, seed: int) -> list[dict]:
    """ragas-format rows (user_input, reference, retrieved_contexts), no row_id column, all with some support."""
    rows = [r for r in make_rows(n, seed=seed) if any(c != "unrelated filler text" for c in r["contexts"])]
    return [
        {"user_input": r["question"], "reference": r["ground_truth"], "retrieved_contexts": r["contexts"],
         "category": r["category"]}
        for r in rows
    ]  # fmt: skip


def ragas_degrade(rows: list[dict], every: int) -> list[dict]:
    as_contexts = [{**r, "contexts": r["retrieved_contexts"]} for r in rows]
    return [
        {k: v for k, v in {**r, "retrieved_contexts": r["contexts"]}.items() if k != "contexts"}
        for r in degrade(as_contexts, every)
    ]


def write(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture
def judge(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


@pytest.fixture
def s3env(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


def cli(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def runs_of(out: str) -> list[dict]:
    ds = ResultStore(out, StorageConfig.from_options(), "delta").read_table("runs")
    rows = [] if ds is None else ds.to_table().to_pylist()
    return [r for r in rows if r["segment_column"] is None]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reindexed_dataset_without_row_id_regresses_with_every_row_paired(
    prefect_harness, judge, s3env, s3_bucket, tmp_path
):
    rows = ragas_rows(90, seed=41)
    key = "evals/golden.parquet"
    uri, out = f"s3://{s3_bucket}/{key}", f"s3://{s3_bucket}/recall"
    s3env.client().upload_file(write(tmp_path / "v1.parquet", rows), s3_bucket, key)
    common = ["--output", out, "--judge", "openai", "--base-url", judge.base_url, "--segment-by", "category"]
    first = cli("run", uri, *common, "--label", "index-v1")
    assert first.exit_code == 0, first.output
    assert "first run of its series" in first.output
    # index v2 rewrites the contexts of every third row: the same test cases, worse retrieval
    s3env.client().upload_file(write(tmp_path / "v2.parquet", ragas_degrade(rows, 3)), s3_bucket, key)
    second = cli("run", uri, *common, "--label", "index-v2", "--fail-on-regression")
    assert second.exit_code == 3, second.output
    line = next(x for x in second.output.splitlines() if x.startswith("vs baseline"))
    assert ": regressed (mean delta -" in line and f"{len(rows)} paired" in line and "95 % CI" in line
    assert "mean_score" in second.output and "HTML report:" in second.output  # the summary, also on exit 3
    store = ResultStore(out, StorageConfig.from_options(), "delta")
    comparison = next(c for c in store.read_table("comparisons").to_table().to_pylist() if c["segment_column"] is None)
    assert comparison["verdict"] == "regressed"
    assert comparison["n_paired"] == len(rows) and comparison["n_added"] == 0 and comparison["n_removed"] == 0
    results = store.read_table("results").to_table(columns=["run_id", "row_id"]).to_pylist()
    by_run: dict[str, set[str]] = {}
    for r in results:
        by_run.setdefault(r["run_id"], set()).add(r["row_id"])
    assert len(by_run) == 2 and len({frozenset(ids) for ids in by_run.values()}) == 1
    assert {r["row_identity"] for r in runs_of(out)} == {ROW_IDENTITY}


def test_row_ids_depend_on_question_and_reference_only(tmp_path):
    rows = ragas_rows(12, seed=5)
    rows.append(dict(rows[0]))  # an exact duplicate test case
    a = write(tmp_path / "a.parquet", rows)
    b = write(tmp_path / "b.parquet", [{**r, "retrieved_contexts": ["something else"]} for r in rows])
    c = write(tmp_path / "c.parquet", [{**r, "reference": r["reference"] + " More."} for r in rows])

    def ids(path: str) -> list[str]:
        from recall_tasks.io.blocks import iter_blocks

        ds = open_dataset(path, StorageConfig.from_options(), "contextual_recall", {})
        return [i for block in iter_blocks(ds, 5) for i in block.row_ids]

    assert ids(a) == ids(b)  # contexts changed: same identity
    assert ids(a)[-1] == ids(a)[0] + "~2" and len(set(ids(a))) == len(rows)
    assert not set(ids(a)) & set(ids(c))  # the reference answer defines the case


def test_a_changed_judge_is_incomparable_and_latest_picks_a_like_for_like_run(prefect_harness, judge, tmp_path):
    data = write(tmp_path / "data" / "eval.parquet", ragas_rows(30, seed=9))
    out = str(tmp_path / "out")
    llm = ["--judge", "openai", "--base-url", judge.base_url]
    assert cli("run", data, "-o", out, *llm, "--label", "a").exit_code == 0
    lexical = cli("run", data, "-o", out, "--label", "b", "--fail-on-regression")
    assert lexical.exit_code == 6, lexical.output  # not a regression (3), but the gate cannot pass it either
    line = next(x for x in lexical.output.splitlines() if x.startswith("vs baseline"))
    assert ": incomparable (" in line and "judge differs (current 'lexical', baseline 'openai')" in line
    again = cli("run", data, "-o", out, *llm, "--label", "c")
    assert again.exit_code == 0, again.output
    runs = {r["label"]: r for r in runs_of(out)}
    line = next(x for x in again.output.splitlines() if x.startswith("vs baseline"))
    assert line.startswith(f"vs baseline {runs['a']['run_id']}: unchanged")  # not the lexical run in between


def test_an_endpoint_failing_every_judge_call_fails_the_run_with_exit_4(prefect_harness, judge, tmp_path):
    data = write(tmp_path / "data" / "eval.parquet", ragas_rows(8, seed=3))
    out = str(tmp_path / "out")
    judge.set_responder(lambda body: {"status": 503, "content": ""})
    # no retries: 8 failed attempts stay below the circuit breaker's 10 (with retries it trips first and its
    # reason names the endpoint, see tests/test_outages.py), so the error-rate rule fails the run
    failed = cli("run", data, "-o", out, "--judge", "openai", "--base-url", judge.base_url, "--max-retries", "0")
    assert failed.exit_code == 4, failed.output
    n = len(ragas_rows(8, seed=3))
    assert f"{n} of {n} assessed rows ended with an error" in failed.output
    assert f"most common ({n} rows)" in failed.output and "503" in failed.output
    assert "mean_score" in failed.output and "HTML report:" in failed.output
    assert "a failed run is never compared nor used as a baseline" in failed.output
    (run,) = runs_of(out)
    assert run["status"] == "failed" and run["error_rate"] == 1.0 and run["top_error_count"] == n
    results = ResultStore(out, StorageConfig.from_options(), "delta").read_table("results").to_table().to_pylist()
    assert len(results) == n and all(r["error"] and r["score"] is None for r in results)  # committed, visible
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run["flow_run_id"]])))
    assert flow_run[0].state is not None and flow_run[0].state.is_failed()
    # a failed run is never a baseline: the next healthy run has no comparable baseline, and says why
    judge.set_responder(judge_script.responder)
    healthy = cli("run", data, "-o", out, "--judge", "openai", "--base-url", judge.base_url, "--refresh-cache")
    assert healthy.exit_code == 0, healthy.output
    assert "no comparable baseline (1 earlier run: 1 failed)" in healthy.output


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        (lambda: f"http://127.0.0.1:{closed_port()}/v1", "connection refused"),
        (lambda: "http://no-such-host.invalid/v1", "DNS lookup failed"),
    ],
)
def test_an_unreachable_endpoint_stops_the_run_before_anything(prefect_harness, judge, tmp_path, base_url, message):
    data = write(tmp_path / "data" / "eval.parquet", ragas_rows(10, seed=1))
    out = tmp_path / "out"
    result = cli("run", data, "-o", str(out), "--judge", "openai", "--base-url", base_url())
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output and "Traceback" not in result.output
    assert not out.exists()  # nothing written, no run recorded


def test_a_rejected_key_stops_the_run_before_any_judge_request(prefect_harness, judge, tmp_path):
    data = write(tmp_path / "data" / "eval.parquet", ragas_rows(10, seed=1))
    out = tmp_path / "out"
    judge.models_reply = Status(401, message="Incorrect API key provided")
    result = cli("run", data, "-o", str(out), "--judge", "openai", "--base-url", judge.base_url)
    assert result.exit_code == 2, result.output
    assert "rejected the API key (401): set OPENAI_API_KEY" in result.output and KEY not in result.output
    assert judge.chat_requests == [] and not out.exists()


def test_a_self_hosted_endpoint_needs_no_key_and_a_missing_models_route_is_a_note(
    prefect_harness, fake_openai, monkeypatch, tmp_path
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    fake_openai.set_responder(judge_script.responder)
    fake_openai.models_reply = Status(404, message="no such route")
    data = write(tmp_path / "data" / "eval.parquet", ragas_rows(10, seed=1))
    result = cli("run", data, "-o", str(tmp_path / "out"), "--judge", "openai", "--base-url", fake_openai.base_url)
    assert result.exit_code == 0, result.output
    assert "could not verify the judge endpoint" in result.output and "HTTP 404" in result.output
    assert len(fake_openai.chat_requests) == len(ragas_rows(10, seed=1))
    # the official endpoint does need a key, and says so before anything else
    official = cli("run", data, "-o", str(tmp_path / "out2"), "--judge", "openai")
    assert official.exit_code == 2 and "no API key for the OpenAI judge: set OPENAI_API_KEY" in official.output


def test_a_bad_baseline_reference_stops_the_run_before_any_judge_request(prefect_harness, judge, tmp_path):
    data = write(tmp_path / "data" / "eval.parquet", ragas_rows(10, seed=1))
    out = str(tmp_path / "out")
    llm = ["--judge", "openai", "--base-url", judge.base_url]
    assert cli("run", data, "-o", out, *llm, "--label", "prod").exit_code == 0
    judge.reset()
    judge.set_responder(judge_script.responder)
    for spec, message in (
        ("label:index-v9", "no completed run labelled 'index-v9'"),
        ("run:nope", "no run with id 'nope'"),
    ):
        result = cli("run", data, "-o", out, *llm, "--baseline", spec, "--refresh-cache")
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "labels available: 'prod'" in result.output or "recent runs of dataset 'eval'" in result.output
    assert judge.chat_requests == []
    assert len(runs_of(out)) == 1  # no run recorded
    empty = cli("run", data, "-o", str(tmp_path / "fresh"), *llm, "--baseline", "label:prod")
    assert empty.exit_code == 2 and "no runs are recorded under" in empty.output


def test_an_output_at_inside_or_around_the_dataset_is_refused(prefect_harness, s3env, s3_bucket, tmp_path):
    s3env.client().upload_file(write(tmp_path / "g.parquet", ragas_rows(6, seed=2)), s3_bucket, "evals/golden.parquet")
    before = sorted(o["Key"] for o in s3env.client().list_objects_v2(Bucket=s3_bucket)["Contents"])
    for dataset, output, said in (
        (f"s3://{s3_bucket}/evals/golden.parquet", f"s3://{s3_bucket}/evals/golden.parquet", "is the dataset"),
        (f"s3://{s3_bucket}/evals/", f"s3a://{s3_bucket}//evals/out/", "is inside the dataset"),
        (f"s3://{s3_bucket}/evals/*.parquet", f"s3://{s3_bucket}/evals/recall", "is inside the dataset"),
        (f"s3://{s3_bucket}/evals/golden.parquet", f"s3://{s3_bucket}", "contains the dataset"),
    ):
        result = cli("run", dataset, "-o", output)
        assert result.exit_code == 2, result.output
        assert said in result.output and "choose an output folder of its own" in result.output
    after = sorted(o["Key"] for o in s3env.client().list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert after == before  # nothing written
    local = write(tmp_path / "data" / "eval.parquet", ragas_rows(6, seed=2))
    inside = cli("run", local, "-o", str(tmp_path / "data" / "eval.parquet" / ".." / "out"))
    assert inside.exit_code == 0, inside.output  # a sibling folder of the dataset file is fine


def test_the_html_report_shows_drops_chunks_reasons_and_one_series_per_judge(prefect_harness, judge, tmp_path):
    rows = ragas_rows(60, seed=17)
    out = str(tmp_path / "out")
    series = ["--dataset-name", "faq", "--segment-by", "category"]  # one series over the index versions' files
    llm = ["--judge", "openai", "--base-url", judge.base_url, *series]
    assert cli("run", write(tmp_path / "v1" / "eval.parquet", rows), "-o", out, *llm, "--label", "a").exit_code == 0
    worse = write(tmp_path / "v2" / "eval.parquet", ragas_degrade(rows, 2))
    assert cli("run", worse, "-o", out, *llm, "--label", "b").exit_code == 0
    assert cli("run", worse, "-o", out, "--label", "c", *series).exit_code == 0
    runs = {r["label"]: r for r in runs_of(out)}
    doc = (Path(out) / "reports" / f"{runs['b']['run_id']}.html").read_text()
    assert "<h2>Largest drops vs baseline</h2>" in doc
    drops = doc.split("<h2>Largest drops vs baseline</h2>", 1)[1].split("</table>", 1)[0]
    lost = {s for i, r in enumerate(rows) if i % 2 == 0 for s in r["reference"].split(". ")}
    assert any(s.rstrip(".") in drops for s in lost)
    assert 'style="color:#c62828;font-weight:600">regressed' in doc  # a regressed segment, coloured
    assert ">score</text>" in doc and ">rows</text>" in doc and ">mean score</text>" in doc  # labelled axes
    worst = doc.split("<h2>Worst rows</h2>", 1)[1]
    assert "retrieved chunks:" in worst and "unrelated filler text" in worst and "not in context" in worst
    trend = (Path(out) / "reports" / f"{runs['c']['run_id']}.html").read_text().split("<h2>Trend</h2>", 1)[1]
    assert "One series per judge configuration" in trend
    assert "gpt-4o-mini (prompt" in trend and "lexical (prompt" in trend
    assert trend.split("</svg>", 1)[0].count("<polyline") == 1  # the two openai runs joined, the lexical one alone


# -- identity of a series, and runs of different series committing at once ------------------------------


def test_two_datasets_sharing_a_file_name_are_two_series(prefect_harness, tmp_path):
    out = str(tmp_path / "out")
    first = make_rows(12, seed=1)
    other = [{**r, "ground_truth": "Something else entirely."} for r in make_rows(12, seed=2)]  # same row ids
    a = cli("run", write(tmp_path / "team-a" / "eval.parquet", first), "-o", out, "--label", "a")
    b = cli("run", write(tmp_path / "team-b" / "eval.parquet", other), "-o", out, "--label", "b")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    assert "first run of its series" in b.output  # not paired with team a's rows by row_id
    ids = {r["label"]: r["dataset_id"] for r in runs_of(out)}
    assert ids == {"a": str(tmp_path / "team-a" / "eval.parquet"), "b": str(tmp_path / "team-b" / "eval.parquet")}


def test_dated_folders_form_one_series_with_a_dataset_name(prefect_harness, tmp_path):
    out = str(tmp_path / "out")
    rows = make_rows(12, seed=1)
    nights = [write(tmp_path / "evals" / day / "golden.parquet", rows) for day in ("2026-11-29", "2026-11-30")]
    plain = cli("run", nights[1], "-o", str(tmp_path / "plain"))
    assert cli("run", nights[0], "-o", str(tmp_path / "plain")).exit_code == 0
    assert "first run of its series" in plain.output
    assert cli("run", nights[0], "-o", out, "--dataset-name", "golden").exit_code == 0
    second = cli("run", nights[1], "-o", out, "--dataset-name", "golden")
    assert second.exit_code == 0, second.output
    assert ": unchanged (" in second.output and "dataset URI differs" not in second.output  # named: moves are fine
    assert {r["dataset"] for r in runs_of(out)} == {"golden"}
    bad = cli("run", nights[1], "-o", out, "--dataset-name", "../x")
    assert bad.exit_code == 2 and "dataset_name" in bad.output


@pytest.mark.concurrency
def test_runs_of_two_datasets_committing_at_once_both_land(tmp_path, monkeypatch, caplog):
    import threading

    import deltalake

    from recall_tasks.io.results import ChunkPart

    store = ResultStore(str(tmp_path / "out"), StorageConfig.from_options())
    chunks = []
    for n, extra in enumerate(("team", "owner", "region")):  # each run brings its own pass-through column
        path = store.chunk_path(f"{n}" * 32, f"run-{n}")
        store.write_chunk(path, pa.table({"row_id": ["a", "b"], "score": [1.0, 0.5], extra: ["x", "y"]}))
        chunks.append(path)

    def commit(n: int) -> None:
        ResultStore(str(tmp_path / "out"), StorageConfig.from_options()).commit(
            f"run-{n}", f"d{n}", "2026-11-30", [ChunkPart(chunks[n])], [{"run_id": f"run-{n}", "dataset": f"d{n}"}]
        )

    commit(0)
    barrier = threading.Barrier(2, timeout=30)
    real_write, calls = deltalake.write_deltalake, []

    def both_from_one_snapshot(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:  # the first attempt of each writer waits for the other: both start from one version
            barrier.wait()
        return real_write(*args, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", both_from_one_snapshot)
    caplog.set_level("INFO", logger="recall_tasks.io.results")
    errors: list[BaseException] = []

    def attempt(n: int) -> None:
        try:
            commit(n)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert "commit conflict" in caplog.text  # the retry path ran
    results = deltalake.DeltaTable(str(tmp_path / "out" / "results")).to_pyarrow_table()
    assert sorted(results.column("run_id").to_pylist()) == ["run-0", "run-0", "run-1", "run-1", "run-2", "run-2"]
    assert {"team", "owner", "region"} <= set(results.column_names)
    runs = deltalake.DeltaTable(str(tmp_path / "out" / "runs")).to_pyarrow_table()
    assert sorted(runs.column("run_id").to_pylist()) == ["run-0", "run-1", "run-2"]


def test_a_relative_output_in_two_folders_shares_no_cache(prefect_harness, tmp_path, monkeypatch):
    data = write(tmp_path / "data" / "eval.parquet", make_rows(12, seed=4))
    for folder in ("team-a", "team-b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        result = cli("run", data, "-o", "out")
        assert result.exit_code == 0, result.output
        (run,) = runs_of(str(tmp_path / folder / "out"))
        assert run["cached"] == 0, folder  # `out` is another location in each folder: nothing is shared


def test_a_newline_in_dataset_values_never_forges_a_log_line(prefect_harness, tmp_path, caplog):
    import logging

    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark

    folder = tmp_path / "evil\nERROR forged line"
    data = write(folder / "eval.parquet", make_rows(6, seed=8))
    caplog.set_level(logging.INFO, logger="prefect.flow_runs")
    recall_benchmark(RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), baseline="latest"))
    messages = [r.getMessage() for r in caplog.records if r.name == "prefect.flow_runs"]
    assert any("evil\\nERROR forged line" in m for m in messages)  # the value, escaped, on its own line
    assert not any("\n" in m for m in messages)
