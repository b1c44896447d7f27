"""``recall-bench batch collect`` and ``batch cancel`` against the fake server's Batch API, and the ``runs`` columns
``batch_ids``/``batch_wait_s`` on a table written before they existed."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges._openai_http import endpoint_host
from tests import judge_script
from tests.fake_openai import FakeOpenAI
from tests.test_batch import cli, record, results, runs, submit_held
from tests.test_pipeline import KEY, make_rows, write_parquet


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def batch(*args: str):
    return CliRunner().invoke(app, ["batch", *args], env={"COLUMNS": "300"})


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_collect_finishes_the_run_as_the_rerun_would_from_the_recorded_parameters(
    prefect_harness, judge_env, tmp_path
) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(12, seed=29))
    out = tmp_path / "out"
    judge_env.batch_hold = True
    submitted = cli(judge_env, data, out, "--batch", "--label", "nightly", "--threshold", "0.4")
    assert submitted.exit_code == 0, submitted.output
    key = record(out)["run_key"]
    assert f"`recall-bench batch collect -o {out} --base-url {judge_env.base_url} {key}`" in one_line(submitted.output)
    assert record(out)["params"]["label"] == "nightly" and "batch_wait" not in record(out)["params"]

    here = ("--base-url", judge_env.base_url)  # where requests go: the command's, never the record's
    running = batch("collect", "-o", str(out), *here)  # checked once: still in progress, nothing committed
    assert running.exit_code == 0 and "in_progress" in running.output, running.output
    assert not (out / "runs").exists() and len(judge_env.batches) == 1

    judge_env.finish_batches()
    collected = batch("collect", "-o", str(out), *here)
    assert collected.exit_code == 0, collected.output
    (run,) = runs(out)
    assert run["status"] == "completed" and run["label"] == "nightly" and run["threshold"] == 0.4
    assert run["batch_ids"] == list(judge_env.batches) and judge_env.chat_requests == []
    assert all(r["score"] is not None for r in results(out).values())
    assert record(out)["status"] == "collected"

    again = batch("collect", "-o", str(out))  # nothing pending any more: said, exit 0, no run
    assert again.exit_code == 0 and f"no pending batches under {out}" in one_line(again.output)
    assert len(runs(out)) == 1


def test_collect_says_clearly_what_it_cannot_do(prefect_harness, judge_env, tmp_path) -> None:
    out = tmp_path / "out"
    nothing = batch("collect", "-o", str(out))
    assert nothing.exit_code == 0 and f"no pending batches under {out}" in one_line(nothing.output)
    unknown = batch("collect", "-o", str(out), "0123456789abcdef0123")
    assert unknown.exit_code == 2
    assert f"error: no batch record for run key 0123456789abcdef0123 under {out}/_batches" in one_line(unknown.output)

    path = tmp_path / "data" / "eval.parquet"
    data = write_parquet(path, make_rows(6, seed=31))
    judge_env.batch_hold = True
    assert cli(judge_env, data, out, "--batch").exit_code == 0
    key = record(out)["run_key"]
    write_parquet(path, make_rows(7, seed=31))  # the data changed: the batches no longer match its rows
    changed = batch("collect", "-o", str(out), "--base-url", judge_env.base_url)
    assert changed.exit_code == 2, changed.output
    assert f"error: the data of {data} changed since its batches were submitted" in one_line(changed.output)
    assert f"recorded {key}" in one_line(changed.output) and len(judge_env.batches) == 1 and not (out / "runs").exists()

    (file,) = (out / "_batches").glob("*.json")
    old = json.loads(file.read_text())
    del old["params"]  # a record written before the parameters were recorded
    file.write_text(json.dumps(old))
    legacy = batch("collect", "-o", str(out), key)
    assert legacy.exit_code == 2
    assert "does not hold the run parameters" in one_line(legacy.output) and "rerun the original" in legacy.output


def test_cancel_cancels_the_pending_batches_and_a_later_run_submits_new_ones(
    prefect_harness, judge_env, tmp_path
) -> None:
    data, out = submit_held(judge_env, tmp_path, 8, 37)
    (first,) = judge_env.batches
    key = record(out)["run_key"]

    cancelled = batch("cancel", "-o", str(out), key, "--base-url", judge_env.base_url)
    assert cancelled.exit_code == 0, cancelled.output
    assert f"batches cancelled: {first}" in one_line(cancelled.output)
    assert KEY not in cancelled.output
    assert judge_env.batches[first]["status"] == "cancelled" and judge_env.stats["batch:cancel"] == 1
    assert record(out)["status"] == "cancelled" and record(out)["parts"][0]["status"] == "cancelled"
    listed = batch("status", "-o", str(out))
    assert f"(key {key}): cancelled, submitted " in listed.output and ", cancelled " in listed.output
    assert batch("cancel", "-o", str(out)).exit_code == 0  # nothing pending: said, nothing called
    assert judge_env.stats["batch:cancel"] == 1
    not_pending = batch("cancel", "-o", str(out), key)
    assert (
        not_pending.exit_code == 2 and f"the batches of run key {key} are cancelled, not pending" in not_pending.output
    )

    fresh = cli(judge_env, data, out, "--batch")  # a cancelled record is not resumed: new batches
    assert fresh.exit_code == 0, fresh.output
    assert len(judge_env.batches) == 2 and record(out)["status"] == "pending"
    assert record(out)["parts"][0]["batch_id"] != first


@pytest.mark.concurrency
def test_a_record_is_state_it_never_says_where_the_key_goes_nor_what_code_runs(
    prefect_harness, judge_env, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    data, out = submit_held(judge_env, tmp_path, 6, 43)
    (file,) = (out / "_batches").glob("*.json")
    honest = json.loads(file.read_text())
    assert honest["params"]["base_url"] == judge_env.base_url and honest["batch_fallback"] == "error"
    here = ("--base-url", judge_env.base_url)
    with FakeOpenAI() as elsewhere:  # someone with write access to the output points the record at their server
        planted = {**honest, "endpoint": endpoint_host(elsewhere.base_url),
                   "params": {**honest["params"], "base_url": elsewhere.base_url}}  # fmt: skip
        file.write_text(json.dumps(planted))
        for command in (("collect",), ("cancel",), ("collect", *here), ("cancel", *here)):
            refused = batch(*command, "-o", str(out))
            assert refused.exit_code == 2, refused.output
            assert f"is refused: field base_url: submitted to {elsewhere.base_url}" in one_line(refused.output)
        assert elsewhere.requests == []  # the key never left: not even the pre-flight or the cancel call
    assert judge_env.stats["batch:cancel"] == 0 and judge_env.chat_requests == []

    for planted_params, name in [
        ({"batch": False, "retriever": "subprocess:check_output"}, "batch"),  # a live run calling a command
        ({"retriever": "subprocess:check_output"}, "retriever"),
        ({"context_extractor": "os:system"}, "context_extractor"),
        ({"task_runner": "dask", "dask_address": "tcp://elsewhere:8786"}, "task_runner"),  # validated, not copied
    ]:
        file.write_text(json.dumps({**honest, "params": {**honest["params"], **planted_params}}))
        refused = batch("collect", "-o", str(out), *here)
        assert refused.exit_code == 2, refused.output
        assert f"is refused: field {name}" in one_line(refused.output) or (
            name == "task_runner" and "--batch runs with --task-runner threads only" in one_line(refused.output)
        ), refused.output
    assert judge_env.chat_requests == [] and not (out / "runs").exists()
    file.write_text(json.dumps(honest))  # the honest record, this command's endpoint: collected
    judge_env.finish_batches()
    done = batch("collect", "-o", str(out), *here)
    assert done.exit_code == 0 and runs(out)[0]["status"] == "completed", done.output


def test_collect_judges_failed_lines_live_with_batch_fallback_live_as_the_rerun_would(
    prefect_harness, judge_env, tmp_path
) -> None:
    data, out = submit_held(judge_env, tmp_path, 8, 79)
    judge_env.finish_batches("expired")  # half the lines answered, the rest expired
    collected = batch("collect", "-o", str(out), "--base-url", judge_env.base_url, "--batch-fallback", "live")
    assert collected.exit_code == 0, collected.output
    assert len(judge_env.batches) == 1 and len(judge_env.chat_requests) == 4  # no round 2: judged live at once
    (run,) = runs(out)
    assert run["status"] == "completed" and run["errors"] == 0 and record(out)["status"] == "collected"


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_a_runs_table_from_before_the_batch_columns_stays_readable(prefect_harness, judge_env, tmp_path, fmt) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(6, seed=41))
    out = tmp_path / "out"
    assert cli(judge_env, data, out, "--format", fmt, "--label", "live").exit_code == 0
    if fmt == "delta":  # the table as recall-bench wrote it before batch_ids and batch_wait_s existed
        old = DeltaTable(str(out / "runs")).to_pyarrow_table().drop_columns(["batch_ids", "batch_wait_s"])
        write_deltalake(str(out / "runs"), old, mode="overwrite", schema_mode="overwrite")
    else:
        (file,) = (out / "runs").rglob("*.parquet")
        pq.write_table(pq.read_table(file).drop_columns(["batch_ids", "batch_wait_s"]), file)
    store = ResultStore(str(out), StorageConfig(), fmt)  # type: ignore[arg-type]
    table = store.read_table("runs")
    assert table is not None and "batch_ids" not in table.schema.names

    done = cli(judge_env, data, out, "--format", fmt, "--batch", "--label", "batch",
               "--cache-uri", str(tmp_path / "cache2"))  # fmt: skip
    assert done.exit_code == 0, done.output
    sql = (
        "SELECT label, batch_ids, batch_wait_s IS NOT NULL AS waited FROM runs WHERE segment_column IS NULL "
        "ORDER BY label"
    )
    queried = CliRunner().invoke(app, ["query", sql, "-o", str(out), "--output-format", "json"])
    assert queried.exit_code == 0, queried.output
    got = [json.loads(line) for line in queried.output.splitlines() if line.strip()]
    assert got == [
        {"label": "batch", "batch_ids": list(judge_env.batches), "waited": True},
        {"label": "live", "batch_ids": None, "waited": False},
    ]
