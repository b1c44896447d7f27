"""``--batch``: the OpenAI Batch API mode against the fake server's /v1/files and /v1/batches, end to end."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.config import RunParams
from recall_tasks.judges.base import JudgeRequest
from recall_tasks.judges.batch import ConfigError, parse_output, request_line, split
from recall_tasks.judges.openai_judge import OpenAIJudge
from recall_tasks.pipeline.flow import recall_benchmark
from tests import judge_script
from tests.fake_openai import FakeOpenAI
from tests.test_pipeline import KEY, make_rows, write_parquet

NO_BATCH_API = "this endpoint has no Batch API; run without --batch"


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


def cli(fake, data: str, out: Path, *extra: str):
    args = ["run", data, "-o", str(out), "--judge", "openai", "--base-url", fake.base_url, "--chunk-size", "7",
            *extra]  # fmt: skip
    return CliRunner().invoke(app, args, env={"COLUMNS": "300"})


def results(out: Path) -> dict[str, dict]:
    return {r["row_id"]: r for r in DeltaTable(str(out / "results")).to_pyarrow_table().to_pylist()}


def runs(out: Path) -> list[dict]:
    return [r for r in DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist() if r["segment_column"] is None]


def submit_held(judge_env: FakeOpenAI, tmp_path: Path, rows: int, seed: int, *extra: str) -> tuple[str, Path]:
    """A ``--batch`` run of ``rows`` rows submitted to a fake that holds its batches (they stay in progress)."""
    data = write_parquet(tmp_path / "eval.parquet", make_rows(rows, seed=seed))
    out = tmp_path / "out"
    judge_env.batch_hold = True
    submitted = cli(judge_env, data, out, "--batch", *extra)
    assert submitted.exit_code == 0, submitted.output
    return data, out


def record(out: Path) -> dict:
    (path,) = (out / "_batches").glob("*.json")
    return json.loads(path.read_text())


# -- the wire format ----------------------------------------------------------------------------------------


def test_split_at_the_line_and_byte_limits() -> None:
    lines = [(f"k{i}", b"x" * 10) for i in range(7)]
    assert [len(p) for p in split(lines, max_lines=3)] == [3, 3, 1]
    assert [len(p) for p in split(lines, max_bytes=25)] == [2, 2, 2, 1]
    with pytest.raises(ConfigError, match="above the batch limit"):
        split([("big", b"x" * 30)], max_bytes=25)


def test_output_lines_are_parsed_tolerantly_by_custom_id() -> None:
    ok = {"custom_id": "a", "response": {"status_code": 200, "body": {
        "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3}}}}  # fmt: skip
    failed = {"custom_id": "b", "response": {"status_code": 500, "body": {"error": {"message": "boom"}}}}
    expired = {"custom_id": "c", "response": None, "error": {"code": "batch_expired", "message": "too late"}}
    text = "\n".join([json.dumps(ok), "", json.dumps({"no": "id"}), json.dumps(failed), json.dumps(expired),
                      json.dumps(ok)[:20]])  # fmt: skip
    lines, problems = parse_output(text)
    assert lines["a"].content == "{}" and (lines["a"].prompt_tokens, lines["a"].completion_tokens) == (7, 3)
    assert lines["b"].error == "HTTP 500: boom" and lines["c"].error == "batch_expired: too late"
    assert problems == ["line 3 has no custom_id", "line 6 is not JSON (a truncated file?): 20 bytes"]


def test_an_output_lines_problem_names_the_line_not_its_text() -> None:
    """A batch output file's line is quoted nowhere: a problem says its number and length (issue 58)."""
    shadow = "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::"
    odd_body = {"custom_id": "b", "response": {"status_code": 200, "body": {"choices": shadow}}}
    lines, problems = parse_output("\n".join(["{}", shadow, json.dumps(odd_body)]))
    assert problems == ["line 1 has no custom_id", f"line 2 is not JSON (a truncated file?): {len(shadow)} bytes"]
    assert lines["b"].line == 3 and lines["b"].error == "the response is not a chat completion (no choices[0])"
    assert all("saltsalt" not in text for text in [*problems, lines["b"].error])


def test_a_batch_line_carries_the_live_judges_request_body(judge_env) -> None:
    import asyncio

    request = JudgeRequest(task="contextual_recall", question="q?", statements=["Alpha bravo."], evidence=["alpha"])
    judge = OpenAIJudge(base_url=judge_env.base_url, api_key=KEY)

    async def live() -> None:
        async with judge:
            await judge.judge(request)

    asyncio.run(live())
    (sent,) = judge_env.chat_requests
    line = json.loads(request_line("key1", judge.batch_body(request)))
    assert line == {"custom_id": "key1", "method": "POST", "url": "/v1/chat/completions", "body": sent["body"]}


def test_a_lost_upload_is_found_by_its_name_and_size_whatever_the_list_order(judge_env) -> None:
    import asyncio

    judge = OpenAIJudge(base_url=judge_env.base_url, api_key=KEY)
    line = request_line("k", {"model": "m", "messages": [{"role": "user", "content": "x"}]})

    async def uploads() -> tuple[list[str], str | None]:
        async with judge:
            client = judge.batch_client()
            ids = [await client.upload("recall-key-0.jsonl", line * n) for n in (1, 2, 3)]  # same name, 3 runs
            return ids, await client.find_upload("recall-key-0.jsonl", len(line) * 2)

    (older, mine, newer), found = asyncio.run(uploads())
    assert found == mine  # listed newest first: neither the first nor the last of the list


# -- submit, pending, collect ---------------------------------------------------------------------------------


def test_submit_is_pending_then_the_same_command_collects_with_live_scores_and_no_live_call(
    prefect_harness, judge_env, tmp_path
) -> None:
    rows = make_rows(30, seed=3)
    data = write_parquet(tmp_path / "data" / "eval.parquet", rows)
    live_out, out = tmp_path / "live", tmp_path / "batch"
    assert cli(judge_env, data, live_out).exit_code == 0
    live_chat = len(judge_env.chat_requests)
    assert live_chat == 30
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    judge_env.batch_hold = True

    submitted = cli(judge_env, data, out, "--batch")
    assert submitted.exit_code == 0, submitted.output
    (batch_id,) = judge_env.batches
    assert "pending: 30 row(s) in 1 batch(es)" in submitted.output and batch_id in submitted.output
    assert "rerun the same command to collect" in submitted.output
    assert not (out / "runs").exists() and not (out / "results").exists()  # not a run yet, never a baseline
    assert judge_env.chat_requests == [] and len(judge_env.uploads) == 1
    assert record(out)["status"] == "pending" and len(record(out)["parts"][0]["custom_ids"]) == 30

    listed = CliRunner().invoke(app, ["batch", "status", "-o", str(out)], env={"COLUMNS": "300"})
    assert listed.exit_code == 0 and f"{batch_id}  in_progress  30 request(s)" in listed.output, listed.output
    assert ": pending, submitted " in listed.output

    still = cli(judge_env, data, out, "--batch")  # still in progress: reported, nothing submitted again
    assert still.exit_code == 0 and "in_progress" in still.output, still.output
    assert len(judge_env.uploads) == 1 and len(judge_env.batches) == 1

    judge_env.finish_batches()
    collected = cli(judge_env, data, out, "--batch")
    assert collected.exit_code == 0, collected.output
    assert judge_env.chat_requests == []  # zero live judge calls for the collected rows
    batch_rows, live_rows = results(out), results(live_out)
    assert {k: r["score"] for k, r in batch_rows.items()} == {k: r["score"] for k, r in live_rows.items()}
    assert [r["verdicts"] for r in batch_rows.values()] == [live_rows[k]["verdicts"] for k in batch_rows]
    assert all(f"judged in batch {batch_id}" in r["flags"] for r in batch_rows.values())
    (run,) = runs(out)
    (live_run,) = runs(live_out)
    assert run["status"] == "completed" and run["requests"] == 30
    assert run["cost_usd"] == pytest.approx(live_run["cost_usd"] / 2)  # gpt-4o-mini's price table, halved
    assert record(out)["status"] == "collected" and not any((out / "_pending").glob("*.json"))
    listed = CliRunner().invoke(app, ["batch", "status", "-o", str(out)], env={"COLUMNS": "300"})
    assert ": collected, submitted " in listed.output and "(0 failed line(s))" in listed.output

    again = cli(judge_env, data, out, "--batch")  # the next night, unchanged data: row-cache hits, no batch
    assert again.exit_code == 0 and len(judge_env.batches) == 1 and judge_env.chat_requests == []
    assert len(runs(out)) == 2


def test_wait_submits_polls_and_finishes_in_one_process(prefect_harness, judge_env, tmp_path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(12, seed=5))
    judge_env.batch_hold = True
    stop = threading.Event()

    def finish_once_submitted() -> None:  # the batch stays in progress for a few polls, then completes
        while not judge_env.batches and not stop.wait(0.05):
            pass
        if not stop.wait(0.6):
            judge_env.finish_batches()

    finisher = threading.Thread(target=finish_once_submitted, daemon=True)
    finisher.start()
    try:
        result = cli(judge_env, data, tmp_path / "out", "--batch", "--wait", "--poll-interval", "0.2",
                     "--batch-timeout", "60")  # fmt: skip
    finally:
        stop.set()
        finisher.join()
    assert result.exit_code == 0, result.output
    assert "pending" not in result.output and runs(tmp_path / "out")[0]["status"] == "completed"
    assert judge_env.chat_requests == [] and len(judge_env.batches) == 1


def test_an_endpoint_without_a_batch_api_is_refused_before_any_upload(prefect_harness, judge_env, tmp_path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(5))
    judge_env.batch_supported = False
    result = cli(judge_env, data, tmp_path / "out", "--batch")
    assert result.exit_code == 2
    assert f"error: {NO_BATCH_API}" in " ".join(result.output.split())
    assert judge_env.uploads == [] and judge_env.chat_requests == []
    assert not (tmp_path / "out" / "_batches").exists() and not (tmp_path / "out" / "runs").exists()


def test_a_batch_cancelled_outside_gives_row_errors_or_live_judging(prefect_harness, judge_env, tmp_path) -> None:
    data, out = submit_held(judge_env, tmp_path, 10, 8)
    (batch_id,) = judge_env.batches
    judge_env.cancel_batch_outside(batch_id)
    resubmitted = cli(judge_env, data, out, "--batch")  # every line unanswered: resubmitted once, in batch 2
    assert resubmitted.exit_code == 0 and "(resubmitted lines)" in resubmitted.output, resubmitted.output
    first, second = judge_env.batches
    assert record(out)["parts"][1]["custom_ids"] == record(out)["parts"][0]["custom_ids"]
    assert cli(judge_env, data, out, "--batch").exit_code == 0 and len(judge_env.batches) == 2  # never twice
    judge_env.cancel_batch_outside(second)
    failed = cli(judge_env, data, out, "--batch")
    assert failed.exit_code == 4, failed.output  # every row an error: above --max-error-rate
    errors = {r["error"] for r in results(out).values()}
    assert len(errors) == 10 and all(
        f"batch {second} was cancelled (request " in e and f"first attempt: batch {first} was cancelled" in e
        for e in errors
    ), errors
    assert judge_env.chat_requests == [] and len(judge_env.batches) == 2

    live = tmp_path / "live"  # the same, with --batch-fallback live: the rows are judged with live calls
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    judge_env.batch_hold = True
    assert cli(judge_env, data, live, "--batch").exit_code == 0
    judge_env.cancel_batch_outside(next(iter(judge_env.batches)))
    rescued = cli(judge_env, data, live, "--batch", "--batch-fallback", "live")
    assert rescued.exit_code == 0, rescued.output
    assert len(judge_env.chat_requests) == 10 and runs(live)[0]["errors"] == 0


def test_unknown_custom_id_is_ignored_and_a_line_truncated_twice_is_a_row_error_naming_both_batches(
    prefect_harness, judge_env, tmp_path, caplog
) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(30, seed=11))
    out = tmp_path / "out"
    judge_env.batch_unknown_line = True
    judge_env.batch_truncate_output = True
    judge_env.batch_hold = True
    judge_env.seed = 1  # the output's shuffle: with this seed the truncated last line is a real one, not the stray
    params = RunParams(dataset_uri=data, output_uri=str(out), judge="openai", base_url=judge_env.base_url,
                       chunk_size=7, batch=True)  # fmt: skip
    pending = recall_benchmark(params)
    assert pending["status"] == "batch_pending" and pending["batches"][0]["status"] == "in_progress"
    judge_env.finish_batches()
    with caplog.at_level(logging.WARNING, logger="recall_tasks.pipeline.batch"):
        again = recall_benchmark(params)  # the line missing from the truncated file: resubmitted alone
    assert again["status"] == "batch_pending" and [b["requests"] for b in again["batches"]] == [30, 1]
    assert "unknown custom_id 'not-a-key-we-sent' ignored" in caplog.text
    assert "is not JSON (a truncated file?)" in caplog.text
    judge_env.batch_unknown_line = False
    judge_env.finish_batches()  # its one-line output is truncated too: the line fails twice
    summary = recall_benchmark(params)
    assert summary["status"] == "completed" and summary["errors"] == 1 and summary["scored"] == 29
    (error,) = [r["error"] for r in results(out).values() if r["error"]]
    first, second = judge_env.batches
    assert f"batch {second} returned no line for this request (a truncated output file?) (request 1)" in error
    assert f"first attempt: batch {first} returned no line" in error
    assert judge_env.chat_requests == []


def test_a_crash_between_upload_and_batch_creation_never_uploads_twice(prefect_harness, judge_env, tmp_path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(8, seed=13))
    out = tmp_path / "out"
    judge_env.batch_create_faults = [500]
    crashed = cli(judge_env, data, out, "--batch", "--max-retries", "0")
    assert crashed.exit_code == 2 and "failed with 500" in crashed.output, crashed.output
    part = record(out)["parts"][0]
    assert part["file_id"] and part["batch_id"] is None and len(judge_env.uploads) == 1

    resumed = cli(judge_env, data, out, "--batch", "--max-retries", "0")
    assert resumed.exit_code == 0, resumed.output  # the batch is created from the recorded file, and completes
    assert len(judge_env.uploads) == 1 and len(judge_env.batches) == 1
    assert runs(out)[0]["rows"] == 8 and judge_env.chat_requests == []

    # the upload's id itself was lost (a crash right after the upload): found again by its file name
    other = tmp_path / "other"
    judge_env.batch_create_faults = [500]
    assert cli(judge_env, data, other, "--batch", "--max-retries", "0").exit_code == 2
    (path,) = (other / "_batches").glob("*.json")
    lost = json.loads(path.read_text())
    (upload,) = [f for f in judge_env.uploads if f["id"] == lost["parts"][0]["file_id"]]
    lost["parts"][0]["file_id"] = None
    path.write_text(json.dumps(lost))
    decoy = judge_env._new_file(upload["filename"], b"{}\n", "batch")  # newer, same name: listed first
    assert cli(judge_env, data, other, "--batch", "--max-retries", "0").exit_code == 0
    assert len(judge_env.uploads) == 3 and len(judge_env.batches) == 2  # no third upload
    assert list(judge_env.batches.values())[-1]["input_file_id"] == upload["id"] != decoy["id"]  # by content


def test_a_batch_created_behind_a_lost_reply_is_found_by_its_metadata_never_created_twice(
    prefect_harness, judge_env, tmp_path
) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(6, seed=61))
    out = tmp_path / "out"
    judge_env.batch_create_lost = [500]  # created, but the reply is a 500: the SDK used to send the POST again
    result = cli(judge_env, data, out, "--batch")
    assert result.exit_code == 0, result.output
    assert judge_env.stats["batch:create"] == 1 and runs(out)[0]["status"] == "completed"
    ((batch_id, batch),) = judge_env.batches.items()
    assert batch["metadata"]["recall_bench_key"] == record(out)["run_key"] and runs(out)[0]["batch_ids"] == [batch_id]


def test_expired_lines_are_judged_live_with_the_fallback_and_an_unusable_reply_gets_one_repair(
    prefect_harness, judge_env, tmp_path
) -> None:
    rows = make_rows(10, seed=17)
    data = write_parquet(tmp_path / "eval.parquet", rows)
    judge_env.batch_hold = True
    assert cli(judge_env, data, tmp_path / "out", "--batch").exit_code == 0
    first = rows[0]["question"]
    judge_env.set_responder(
        lambda body: "not json at all" if first in str(body) and len(body["messages"]) == 2
        else judge_script.responder(body)
    )  # fmt: skip
    judge_env.finish_batches("expired")  # half the lines answered, the rest in the error file
    result = cli(judge_env, data, tmp_path / "out", "--batch", "--batch-fallback", "live")
    assert result.exit_code == 0, result.output
    got = results(tmp_path / "out")
    answered = [r for r in got.values() if any(f.startswith("judged in batch") for f in r["flags"])]
    assert len(answered) == 5 and runs(tmp_path / "out")[0]["errors"] == 0
    repaired = [r for r in answered if "repaired after an unusable first reply" in r["flags"]]
    # the 5 expired lines judged live, and one live repair call for the unusable batch reply
    assert len(repaired) == 1 and len(judge_env.chat_requests) == 5 + 1
    assert len(judge_env.batches) == 1  # judged live instead of resubmitted


# -- the one resubmission ----------------------------------------------------------------------------------


def input_ids(fake, batch_id: str) -> list[str]:
    """The custom ids the fake received in a batch's input file."""
    data = fake.files[fake.batches[batch_id]["input_file_id"]]["data"].decode()
    return [json.loads(line)["custom_id"] for line in data.splitlines() if line]


def test_expired_lines_are_resubmitted_once_with_exactly_the_missing_lines_then_scored(
    prefect_harness, judge_env, tmp_path
) -> None:
    data, out = submit_held(judge_env, tmp_path, 10, 19)
    judge_env.finish_batches("expired")  # half the lines answered, the rest in the error file as batch_expired
    (first,) = judge_env.batches
    output = judge_env.files[judge_env.batches[first]["output_file_id"]]["data"].decode()
    answered = {json.loads(line)["custom_id"] for line in output.splitlines() if line}
    assert len(answered) == 5

    resubmitted = cli(judge_env, data, out, "--batch")
    assert resubmitted.exit_code == 0 and "(resubmitted lines)" in resubmitted.output, resubmitted.output
    first, second = judge_env.batches
    assert sorted(input_ids(judge_env, second)) == sorted(set(input_ids(judge_env, first)) - answered)
    assert record(out)["resubmitted"] == 5 and [p["round"] for p in record(out)["parts"]] == [1, 2]
    still = cli(judge_env, data, out, "--batch")  # round 2 still running: checked, never resubmitted twice
    assert still.exit_code == 0 and len(judge_env.batches) == 2 and len(judge_env.uploads) == 2

    judge_env.finish_batches()
    done = cli(judge_env, data, out, "--batch")
    assert done.exit_code == 0, done.output
    got = results(out)
    assert all(r["score"] is not None and r["error"] is None for r in got.values()) and len(got) == 10
    by_batch = [next(f for f in r["flags"] if f.startswith("judged in batch")) for r in got.values()]
    assert sorted(by_batch) == [f"judged in batch {first}"] * 5 + [f"judged in batch {second}"] * 5
    assert judge_env.chat_requests == []
    (run,) = runs(out)
    assert run["batch_ids"] == [first, second] and run["batch_wait_s"] > 0
    sql = "SELECT batch_ids[2] AS second, batch_wait_s > 0 AS waited FROM runs WHERE segment_column IS NULL"
    queried = CliRunner().invoke(app, ["query", sql, "-o", str(out), "--output-format", "json"])
    assert queried.exit_code == 0, queried.output
    assert json.loads(queried.output.strip()) == {"second": second, "waited": True}


def test_a_line_failing_twice_is_a_row_error_naming_the_batch_and_line(prefect_harness, judge_env, tmp_path) -> None:
    rows = make_rows(30, seed=23)
    data = write_parquet(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    target = rows[4]["question"]
    judge_env.batch_fail_line = lambda custom_id, body: target in str(body)  # a 500 in both rounds
    result = cli(judge_env, data, out, "--batch")  # batches end at once: submit, resubmit, collect in one go
    assert result.exit_code == 0, result.output  # 1 error in 30 rows: within --max-error-rate
    first, second = judge_env.batches
    assert len(input_ids(judge_env, first)) == 30 and len(input_ids(judge_env, second)) == 1
    (error,) = [r["error"] for r in results(out).values() if r["error"]]
    assert f"batch {second} line 1 failed: HTTP 500" in error, error
    assert f"(resubmitted once; first attempt: batch {first} line 1 failed: HTTP 500" in error, error
    assert runs(out)[0]["errors"] == 1 and judge_env.chat_requests == []


def test_collect_only_with_nothing_submitted_does_nothing(prefect_harness, judge_env, tmp_path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(5))
    out = tmp_path / "out"
    result = cli(judge_env, data, out, "--batch", "--collect-only")
    assert result.exit_code == 0, result.output
    assert "nothing to collect: no batches were submitted for these parameters and this data" in result.output
    assert judge_env.uploads == [] and judge_env.batches == {} and judge_env.chat_requests == []
    assert not (out / "runs").exists() and not list((out / "_pending").glob("*.json"))
    refused = cli(judge_env, data, out, "--collect-only")
    assert refused.exit_code == 2 and "--collect-only applies to --batch runs" in refused.output, refused.output


# -- paying once: --refresh-cache, duplicate rows, budgets -----------------------------------------------------


def output_usage(fake) -> tuple[int, int]:
    """The prompt and completion tokens of every answered line of every batch the fake processed."""
    prompt = completion = 0
    for batch in fake.batches.values():
        if batch.get("output_file_id"):
            for line in fake.files[batch["output_file_id"]]["data"].decode().splitlines():
                usage = json.loads(line)["response"]["body"]["usage"]
                prompt, completion = prompt + usage["prompt_tokens"], completion + usage["completion_tokens"]
    return prompt, completion


def test_refresh_cache_with_batch_serves_what_it_collected_without_a_live_call(
    prefect_harness, judge_env, tmp_path
) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(6, seed=67))
    out = tmp_path / "out"
    assert cli(judge_env, data, out).exit_code == 0 and len(judge_env.chat_requests) == 6  # the cache is full
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    refreshed = cli(judge_env, data, out, "--batch", "--refresh-cache")  # re-judged in a batch, paid once
    assert refreshed.exit_code == 0, refreshed.output
    assert judge_env.chat_requests == [] and len(input_ids(judge_env, next(iter(judge_env.batches)))) == 6
    latest = max(runs(out), key=lambda r: r["started_at"])
    assert latest["requests"] == 6 and latest["batch_ids"] == list(judge_env.batches)


def test_duplicate_rows_share_one_billed_lines_tokens_and_cost(prefect_harness, judge_env, tmp_path) -> None:
    rows = make_rows(5, seed=71)
    rows += [{**rows[0], "row_id": "copy0"}, {**rows[1], "row_id": "copy1"}, {**rows[1], "row_id": "copy1b"}]
    data = write_parquet(tmp_path / "eval.parquet", rows)
    out = tmp_path / "out"
    result = cli(judge_env, data, out, "--batch")
    assert result.exit_code == 0, result.output
    (batch_id,) = judge_env.batches
    assert len(input_ids(judge_env, batch_id)) == 5  # one line per distinct request
    got = results(out)
    assert got["copy1b"]["score"] == got["r0001"]["score"] and all(r["error"] is None for r in got.values())
    (run,) = runs(out)
    prompt, completion = output_usage(judge_env)
    assert (run["requests"], run["prompt_tokens"], run["completion_tokens"]) == (5, prompt, completion)
    assert run["cost_usd"] == pytest.approx((prompt * 0.15 + completion * 0.60) / 1e6 / 2)  # gpt-4o-mini, halved


def test_max_requests_bounds_what_the_batch_submits_and_collected_rows_are_never_not_judged(
    prefect_harness, judge_env, tmp_path
) -> None:
    data, out = submit_held(judge_env, tmp_path, 10, 73, "--max-requests", "4")
    (batch_id,) = judge_env.batches
    assert len(input_ids(judge_env, batch_id)) == 4  # only what the budget allows is submitted (and billed)
    judge_env.finish_batches()
    done = cli(judge_env, data, out, "--batch", "--max-requests", "4")
    assert done.exit_code == 5, done.output  # stopped by its budget: committed, not a completed run
    got = results(out).values()
    assert sum(f"judged in batch {batch_id}" in r["flags"] for r in got) == 4, done.output  # every collected row
    assert sum((r["reason"] or "").startswith("not judged: request budget reached") for r in got) == 6
    assert judge_env.chat_requests == [] and runs(out)[0]["status"] == "budget_exhausted"
    assert runs(out)[0]["requests"] == 4
