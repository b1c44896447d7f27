"""The Prefect pipeline end to end with real components: Prefect's test server, SeaweedFS, the fake judge."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from recall_tasks import ConfigError, DatasetError, JudgeConfigError, StorageError
from recall_tasks.config import RunParams
from recall_tasks.errors import RunFailed
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig, delta_storage_options
from recall_tasks.pipeline.artifacts import artifact_key
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.fake_openai import Status

KEY = "sk-pipeline-SECRET-abcdef0123456789"
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
]


def make_rows(n: int, seed: int = 7) -> list[dict]:
    """Rows whose truth is known under judge_script's rule (some sentences supported, some not)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        sentences = [" ".join(rng.sample(WORDS, 3)).capitalize() + "." for _ in range(rng.randint(1, 4))]
        chunks = [s.rstrip(".").lower() + " with context" for s in sentences if rng.random() < 0.6]
        chunks.append("unrelated filler text")
        rows.append(
            {
                "row_id": f"r{i:04d}",
                "question": f"What about item {i}?",
                "ground_truth": " ".join(sentences),
                "contexts": chunks,
                "category": rng.choice(["a", "b", "c"]),
                "lang": "en",
            }
        )
    return rows


def expected(row: dict) -> float:
    from recall_tasks import split_sentences

    return judge_script.expected_score("contextual_recall", split_sentences(row["ground_truth"]), row["contexts"])


def write_parquet(path: Path, rows: list[dict], row_group_size: int = 1000) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return str(path)


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def params(**kw) -> RunParams:
    kw.setdefault("chunk_size", 7)
    return RunParams(**kw)


def test_local_run_delta_scores_match_truth(prefect_harness, judge_env, tmp_path):
    rows = make_rows(40)
    data = write_parquet(tmp_path / "data" / "eval.parquet", rows, row_group_size=15)
    out = tmp_path / "out"
    summary = recall_benchmark(
        params(
            dataset_uri=data,
            output_uri=str(out),
            judge="openai",
            base_url=judge_env.base_url,
            segment_by=["category"],
            label="idx-1",
        )
    )
    assert summary["rows"] == 40 and summary["scored"] == 40 and summary["errors"] == 0
    assert summary["requests"] == 40 and len(judge_env.chat_requests) == 40
    results = DeltaTable(str(out / "results")).to_pyarrow_table()
    assert results.num_rows == 40
    got = dict(zip(results.column("row_id").to_pylist(), results.column("score").to_pylist(), strict=True))
    assert got == {r["row_id"]: pytest.approx(expected(r)) for r in rows}
    assert set(results.column("category").to_pylist()) == {"a", "b", "c"}
    assert set(results.column("dataset").to_pylist()) == {"eval"}
    assert results.column("verdicts")[0].as_py()[0].keys() >= {"statement", "verdict", "reason", "chunk_ids"}
    runs = DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist()
    overall = [r for r in runs if r["segment_column"] is None]
    assert len(overall) == 1 and overall[0]["label"] == "idx-1" and overall[0]["rows"] == 40
    mean = sum(expected(r) for r in rows) / 40
    assert overall[0]["mean_score"] == pytest.approx(mean)
    assert overall[0]["ci_low"] <= mean <= overall[0]["ci_high"]
    segs = {r["segment_value"]: r for r in runs if r["segment_column"] == "category"}
    assert set(segs) == {"a", "b", "c"} and sum(s["rows"] for s in segs.values()) == 40
    for value, seg in segs.items():
        members = [r for r in rows if r["category"] == value]
        assert seg["mean_score"] == pytest.approx(sum(expected(r) for r in members) / len(members))
    assert not any((out / "_pending").glob("*.json"))  # .lock: io/lease.py


def test_markdown_report_lists_the_worst_rows_and_their_missing_sentences(prefect_harness, judge_env, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from recall_tasks import split_sentences

    rows = make_rows(40, seed=53)
    data = write_parquet(tmp_path / "eval.parquet", rows)
    summary = recall_benchmark(
        params(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="openai", base_url=judge_env.base_url)
    )
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key("report", "eval", "contextual_recall")])
            )
        )
    report = next(a.data for a in arts if summary["run_id"] in a.data)
    listed = [line for line in report.splitlines() if line.startswith("| `r")]
    assert len(listed) == 10
    by_id = {r["row_id"]: r for r in rows}
    scores = {rid: expected(r) for rid, r in by_id.items()}
    ids = [line.split("`")[1] for line in listed]
    assert [scores[i] for i in ids] == sorted(scores[i] for i in ids)  # lowest first
    assert max(scores[i] for i in ids) <= min(s for rid, s in scores.items() if rid not in ids)
    for rid, line in zip(ids, listed, strict=True):
        sentences = split_sentences(by_id[rid]["ground_truth"])
        verdicts = judge_script.truth("contextual_recall", sentences, by_id[rid]["contexts"])
        missing = [s for s, (v, _) in zip(sentences, verdicts, strict=True) if v == "no"]
        assert all(f"“{s}”" in line for s in missing) and (missing or line.rstrip().endswith("| - |"))


def test_s3_run_delta_and_parquet(prefect_harness, judge_env, s3_server, s3_bucket, monkeypatch, tmp_path):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    rows = make_rows(25, seed=3)
    local = write_parquet(tmp_path / "eval.parquet", rows)
    s3_server.client().upload_file(local, s3_bucket, "datasets/eval.parquet")
    for fmt in ("delta", "parquet"):
        out = f"s3://{s3_bucket}/out-{fmt}"
        summary = recall_benchmark(
            params(
                dataset_uri=f"s3://{s3_bucket}/datasets/eval.parquet",
                output_uri=out,
                judge="openai",
                base_url=judge_env.base_url,
                format=fmt,
            )
        )
        assert summary["scored"] == 25
        store = ResultStore(out, StorageConfig.from_options(), fmt)
        results = store.read_table("results").to_table()
        assert results.num_rows == 25
        got = dict(zip(results.column("row_id").to_pylist(), results.column("score").to_pylist(), strict=True))
        assert got == {r["row_id"]: pytest.approx(expected(r)) for r in rows}
        assert store.read_table("runs").to_table().num_rows == 1
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.startswith("out-parquet/results/dataset=eval/run_date=") for k in keys)
    assert not any(k.startswith(("out-delta/_pending/", "out-parquet/_pending/")) for k in keys)


def test_permanent_judge_failures_are_recorded_per_row(prefect_harness, judge_env, tmp_path):
    rows = make_rows(12, seed=5)
    data = write_parquet(tmp_path / "eval.parquet", rows)
    bad = {"r0003", "r0007"}

    def responder(body):
        text = json.dumps(body)
        if any(f"item {int(b[1:])}?" in text for b in bad):
            return "this is not json at all"
        return judge_script.responder(body)

    judge_env.set_responder(responder)
    out = tmp_path / "out"
    summary = recall_benchmark(
        params(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge_env.base_url, max_error_rate=0.2)
    )
    assert summary["errors"] == 2 and summary["scored"] == 10 and summary["rows"] == 12
    assert summary["status"] == "completed" and summary["error_rate"] == pytest.approx(2 / 12)
    results = DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()
    errored = {r["row_id"]: r for r in results if r["error"]}
    assert set(errored) == bad
    assert all("JudgeResponseError" in r["error"] and r["score"] is None for r in errored.values())
    assert summary["mean_score"] == pytest.approx(sum(expected(r) for r in rows if r["row_id"] not in bad) / 10)


def test_auth_error_stops_the_run_and_writes_nothing(prefect_harness, judge_env, tmp_path):
    data = write_parquet(tmp_path / "eval.parquet", make_rows(30))
    judge_env.enqueue(*[Status(401, message=f"bad key {KEY}")] * 40)
    out = tmp_path / "out"
    with pytest.raises(JudgeConfigError, match="rejected the API key") as info:
        recall_benchmark(params(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge_env.base_url))
    assert KEY not in str(info.value)
    assert not (out / "results").exists() and not (out / "runs").exists()
    assert len(judge_env.chat_requests) < 30


def _bad_dataset(tmp_path: Path, kind: str) -> tuple[str, str]:
    rows = make_rows(5)
    p = tmp_path / "bad" / "eval.parquet"
    if kind == "missing-column":
        return write_parquet(p, [{k: v for k, v in r.items() if k != "ground_truth"} for r in rows]), "ground_truth"
    if kind == "mistyped-column":
        return write_parquet(p, [{**r, "ground_truth": 3} for r in rows]), "expected string, found int64"
    if kind == "string-context":
        return write_parquet(p, [{**r, "contexts": "one chunk"} for r in rows]), "expected list<string>"
    if kind == "int-chunks":
        return write_parquet(p, [{**r, "contexts": [1, 2]} for r in rows]), "expected list<string>"
    if kind == "corrupted":
        p.parent.mkdir(parents=True)
        p.write_bytes(b"PAR1 this is not parquet")
        return str(p), "not a readable Parquet file"
    if kind == "duplicate-ids":
        return write_parquet(p, [{**r, "row_id": "same"} for r in rows]), "duplicate"
    if kind == "missing-file":
        return str(tmp_path / "nope.parquet"), "not found"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "missing-column",
        "mistyped-column",
        "string-context",
        "int-chunks",
        "corrupted",
        "duplicate-ids",
        "missing-file",
    ],
)
def test_bad_datasets_fail_before_judging_or_writing(prefect_harness, judge_env, tmp_path, kind):
    uri, message = _bad_dataset(tmp_path, kind)
    out = tmp_path / "out"
    with pytest.raises((DatasetError, StorageError)) as info:
        recall_benchmark(params(dataset_uri=uri, output_uri=str(out), judge="openai", base_url=judge_env.base_url))
    assert message in str(info.value)
    assert "eval.parquet" in str(info.value) or "nope.parquet" in str(info.value)
    assert judge_env.chat_requests == []
    assert not out.exists() or not any(out.rglob("*.parquet"))


def test_wrong_s3_credentials_fail_cleanly(prefect_harness, s3_server, s3_bucket, monkeypatch, tmp_path):
    data = write_parquet(tmp_path / "eval.parquet", make_rows(3))
    s3_server.client().upload_file(data, s3_bucket, "eval.parquet")
    env = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-value-123"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(StorageError, match="access denied") as info:
        recall_benchmark(params(dataset_uri=f"s3://{s3_bucket}/eval.parquet", output_uri=f"s3://{s3_bucket}/out"))
    assert "wrong-secret-value-123" not in str(info.value) and s3_server.access_key not in str(info.value)


def test_missing_values_follow_policy_and_are_counted(prefect_harness, tmp_path):
    rows = make_rows(6)
    rows[1]["ground_truth"] = None
    rows[2]["contexts"] = []
    rows[3]["ground_truth"] = "   "
    data = write_parquet(tmp_path / "eval.parquet", rows)
    with pytest.raises(RunFailed, match="3 of 6 assessed rows ended with an error") as failed:
        recall_benchmark(params(dataset_uri=data, output_uri=str(tmp_path / "o1")))
    s_err = failed.value.summary  # a failed run is committed: its rows and the summary are there
    assert s_err["errors"] == 3 and s_err["scored"] == 3 and s_err["status"] == "failed"
    assert "expected_output" in s_err["top_error"] or "retrieval_context" in s_err["top_error"]
    s_skip = recall_benchmark(params(dataset_uri=data, output_uri=str(tmp_path / "o2"), on_missing="skip"))
    assert s_skip["skipped"] == 3 and s_skip["scored"] == 3 and s_skip["errors"] == 0
    s_zero = recall_benchmark(params(dataset_uri=data, output_uri=str(tmp_path / "o3"), on_missing="zero"))
    assert s_zero["scored"] == 6
    res = DeltaTable(str(tmp_path / "o1" / "results")).to_pyarrow_table().to_pylist()
    errors = {r["row_id"]: r["error"] for r in res if r["error"]}
    assert "expected_output" in errors["r0001"] and "retrieval_context" in errors["r0002"]


def test_rows_without_ids_get_stable_unique_content_ids(prefect_harness, tmp_path):
    rows = [{k: v for k, v in r.items() if k != "row_id"} for r in make_rows(5)]
    rows.append(dict(rows[0]))
    data = write_parquet(tmp_path / "eval.parquet", rows)
    a = recall_benchmark(params(dataset_uri=data, output_uri=str(tmp_path / "o")))
    b = recall_benchmark(params(dataset_uri=data, output_uri=str(tmp_path / "o")))
    res = DeltaTable(str(tmp_path / "o" / "results")).to_pyarrow_table()
    by_run: dict[str, list[str]] = {}
    for run_id, row_id in zip(res.column("run_id").to_pylist(), res.column("row_id").to_pylist(), strict=True):
        by_run.setdefault(run_id, []).append(row_id)
    ids_a, ids_b = sorted(by_run[a["run_id"]]), sorted(by_run[b["run_id"]])
    assert ids_a == ids_b and len(set(ids_a)) == 6
    assert any(i.endswith("~2") for i in ids_a)


def test_no_secret_in_tables_logs_or_artifacts(
    prefect_harness, judge_env, s3_server, s3_bucket, monkeypatch, tmp_path, caplog
):
    import logging

    caplog.set_level(logging.DEBUG)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    data = write_parquet(tmp_path / "eval.parquet", make_rows(8))
    out = f"s3://{s3_bucket}/out"
    summary = recall_benchmark(params(dataset_uri=data, output_uri=out, judge="openai", base_url=judge_env.base_url))
    opts = delta_storage_options(out, StorageConfig.from_options())
    tables = [DeltaTable(f"{out}/{t}", storage_options=opts).to_pyarrow_table() for t in ("results", "runs")]
    dumped = json.dumps([t.to_pylist() for t in tables], default=str) + json.dumps(summary, default=str)
    from prefect.client.orchestration import get_client

    async def artifacts():  # this run's only: a page of the session's artifacts may leave them out
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        flow_run = ArtifactFilterFlowRunId(any_=[summary["flow_run_id"]])
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=flow_run))

    import asyncio

    arts = asyncio.run(artifacts())
    dumped += json.dumps([a.data for a in arts], default=str)
    info_text = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    import re
    import urllib.request

    # by default no presigned link anywhere: artifacts (kept by Prefect, shown to the whole workspace) and events
    # carry the report's storage URI (before: a 7-day link naming the access key id, in every artifact)
    events = _events_of(summary["run_id"])
    for text in (dumped, events):
        assert not re.search(r"X-Amz-|Signature=|AWSAccessKeyId", text), text[:2000]
    key = artifact_key("html", "eval", "contextual_recall")
    (html_link,) = [a.data for a in arts if a.key == key]
    assert html_link.endswith(f"]({out}/reports/{summary['run_id']}.html)"), html_link
    for secret in (KEY, s3_server.secret_key, s3_server.access_key):
        assert secret not in dumped and secret not in events
        assert secret not in info_text
    # botocore's own DEBUG lines name the access key id in the signature scope, never the secrets
    assert KEY not in caplog.text and s3_server.secret_key not in caplog.text
    assert any(a.key == artifact_key("report", "eval", "contextual_recall") for a in arts)

    # opted in: a presigned link, valid the hour asked for, that opens; its X-Amz-Credential names the access key
    # id (an identifier, not a secret); the secret key never appears
    monkeypatch.setenv("RECALL_BENCH_REPORT_LINK_S", "3600")
    again = recall_benchmark(params(dataset_uri=data, output_uri=out, judge="openai", base_url=judge_env.base_url))
    links = [str(a.data) for a in asyncio.run(_artifacts_of(again["flow_run_id"])) if a.key == key]
    url = re.search(r"\((http://[^)]+)\)", links[0] if links else "")
    assert url is not None and "Signature=" in url.group(1), links
    lifetime = re.search(r"X-Amz-Expires=(\d+)", url.group(1))  # SigV4; SigV2 (s3fs's default): Expires=epoch
    expires = re.search(r"[?&]Expires=(\d+)", url.group(1))
    seconds = int(lifetime.group(1)) if lifetime else int(expires.group(1)) - time.time() if expires else None
    assert seconds is not None and 3500 < seconds <= 3600, url.group(1)
    with urllib.request.urlopen(url.group(1), timeout=10) as reply:
        assert reply.status == 200 and again["run_id"] in reply.read().decode()
    signed = json.dumps([a.data for a in asyncio.run(_artifacts_of(again["flow_run_id"]))], default=str)
    unsigned = re.sub(r"(X-Amz-Credential|AWSAccessKeyId)=[^&\s\")]+", "key-id=...", signed)
    assert unsigned != signed
    for secret in (KEY, s3_server.secret_key, s3_server.access_key):
        assert secret not in unsigned
    assert s3_server.secret_key not in signed
    monkeypatch.setenv("RECALL_BENCH_REPORT_LINK_S", "30 days")
    with pytest.raises(ConfigError, match="RECALL_BENCH_REPORT_LINK_S='30 days': expected whole seconds"):
        recall_benchmark(params(dataset_uri=data, output_uri=out, judge="openai", base_url=judge_env.base_url))


async def _artifacts_of(flow_run_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        flow_run = ArtifactFilterFlowRunId(any_=[flow_run_id])
        return await client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=flow_run))


def _events_of(run_id: str, timeout: float = 30.0) -> str:
    """The JSON of the stored events that name ``run_id`` (``recall.run.completed`` at least: the server persists
    events a moment after they are sent)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in _stored_events() if run_id in json.dumps(e)]
        if any(e["event"] == "recall.run.completed" for e in found) or time.monotonic() > deadline:
            assert found, f"no stored event names run {run_id}"
            return json.dumps(found)
        time.sleep(0.5)


def _stored_events() -> list[dict[str, Any]]:
    """Every event the session's Prefect server stored (all pages)."""
    import urllib.request

    from prefect.settings import PREFECT_API_URL

    body = json.dumps({"filter": {}, "limit": 50}).encode()
    request = urllib.request.Request(
        f"{PREFECT_API_URL.value()}/events/filter", data=body, headers={"Content-Type": "application/json"}
    )
    found: list[dict[str, Any]] = []
    while True:
        with urllib.request.urlopen(request, timeout=10) as resp:
            page = json.loads(resp.read())
        found += page["events"]
        if not page.get("next_page"):
            return found
        request = urllib.request.Request(page["next_page"])


def test_query_cli_returns_the_run(prefect_harness, tmp_path):
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    data = write_parquet(tmp_path / "eval.parquet", make_rows(5))
    out = str(tmp_path / "out")
    runner = CliRunner()
    r = runner.invoke(app, ["run", data, "--output", out, "--label", "cli-test", "--chunk-size", "2"])
    assert r.exit_code == 0, r.output
    assert "mean_score" in r.output
    q = runner.invoke(app, ["query", "SELECT label, rows FROM runs", "--output", out])
    assert q.exit_code == 0, q.output
    assert "cli-test" in q.output and "5" in q.output
    bad = runner.invoke(app, ["run", str(tmp_path / "missing.parquet"), "--output", out])
    assert bad.exit_code == 2 and "not found" in bad.output


def test_params_refuse_secret_storage_options():
    with pytest.raises(ValueError, match="look secret"):
        RunParams(dataset_uri="x", storage_options={"aws_secret_access_key": "abc"})
    with pytest.raises(ValueError, match="above scale"):
        RunParams(dataset_uri="x", threshold=2)
    assert os.environ.get("OPENAI_API_KEY") is None
