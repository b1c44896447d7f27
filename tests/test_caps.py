"""``--max-requests`` and ``--max-cost-usd`` hold: every HTTP attempt is paid for before it is sent.

Against the fake OpenAI server (~100 ms a reply, usage in each): the cost cap with 64 calls in flight, repairs
under a request cap, a cap below one request's worst case, a Ctrl-C then a resumed run under one cap, and a
budget-stopped run rerun with a higher cap. Each prints its figures (requests and cost) for the record.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from recall_tasks.errors import BudgetExhausted
from tests import judge_script
from tests.test_caching import ROOT, cli_env, results_of, run, write
from tests.test_pipeline import KEY, make_rows


@pytest.fixture
def judge_env(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.1
    return fake_openai


def _stopped(judge, data: str, out: Path, **kw: Any) -> dict[str, Any]:
    """A run the budget stops: its flow run ends Failed (a partial run) with the summary on the exception."""
    with pytest.raises(BudgetExhausted) as stopped:
        run(judge, data, out, **kw)
    return dict(stopped.value.summary)


def _runs(out: Path) -> list[dict[str, Any]]:
    return [r for r in DeltaTable(str(out / "runs")).to_pyarrow_table().to_pylist() if r["segment_column"] is None]


@pytest.mark.concurrency
def test_max_cost_usd_is_never_exceeded_with_64_calls_in_flight(prefect_harness, judge_env, tmp_path):
    """A third of the dataset's cost as the cap, 64 calls in flight: before, every call in flight when the cap
    was reached was paid (2.1 x the cap); now each attempt reserves its worst case first."""
    data = write(tmp_path / "eval.parquet", make_rows(300, seed=5))
    full = run(judge_env, data, tmp_path / "full", chunk_size=100, max_concurrency=64, cache=False)
    cap = round(full["cost_usd"] / 3, 6)
    judge_env.reset()
    judge_env.set_responder(judge_script.responder)
    summary = _stopped(judge_env, data, tmp_path / "out", chunk_size=100, max_concurrency=64, max_cost_usd=cap)
    ratio = summary["cost_usd"] / cap
    print(f"\n[cost cap] cap {cap:g} USD: cost_usd {summary['cost_usd']:.6f} ({ratio:.2f} x the cap), "
          f"{summary['requests']} requests ({len(judge_env.chat_requests)} sent)")  # fmt: skip
    assert summary["status"] == "budget_exhausted" and f"--max-cost-usd {cap:g}" in summary["status_reason"]
    assert summary["cost_usd"] <= cap
    assert summary["requests"] == len(judge_env.chat_requests) > 0
    (recorded,) = _runs(tmp_path / "out")
    assert recorded["cost_usd"] == pytest.approx(summary["cost_usd"]) and recorded["cost_usd"] <= cap


def _needs_repair(body: dict[str, Any]) -> str:
    """Every first reply is unusable; the repair (the conversation with the reply) is answered right."""
    if any(m.get("role") == "assistant" for m in body["messages"]):
        return judge_script.responder(body)
    return "I cannot answer in JSON today."


def test_max_requests_counts_repairs_before_they_are_sent(prefect_harness, judge_env, tmp_path):
    """Before: repairs were charged after they were sent (45 requests under --max-requests 30)."""
    judge_env.set_responder(_needs_repair)
    data = write(tmp_path / "eval.parquet", make_rows(40, seed=6))
    summary = _stopped(judge_env, data, tmp_path / "out", max_requests=30, max_concurrency=8)
    sent = len(judge_env.chat_requests)
    print(f"\n[repairs] --max-requests 30: {sent} requests sent, runs.requests {summary['requests']}")
    assert sent <= 30 and summary["requests"] == sent
    assert summary["status"] == "budget_exhausted" and "--max-requests 30" in summary["status_reason"]
    got = results_of(tmp_path / "out", summary["run_id"])
    assert sum(r["requests"] for r in got.values()) == sent


def _cli(judge, data: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "recall_tasks", "run", data, "--output", str(out), "--judge", "openai",
           "--base-url", judge.base_url, "--chunk-size", "10", "--max-concurrency", "4", *extra]  # fmt: skip
    pipe = subprocess.PIPE
    return subprocess.Popen(cmd, env=cli_env(judge), cwd=ROOT, stdout=pipe, stderr=pipe, text=True)


@pytest.mark.concurrency
def test_a_cap_below_one_request_is_refused_before_any_call(prefect_harness, judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(10, seed=8))
    proc = _cli(judge_env, data, tmp_path / "out", "--max-cost-usd", "0.000001")
    stdout, stderr = proc.communicate(timeout=120)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    print(f"\n[too small] exit {proc.returncode}: {errors}")
    assert proc.returncode == 2, stdout + stderr
    assert len(errors) == 1 and "--max-cost-usd 1e-06" in errors[0] and "worst case" in errors[0], stderr
    assert not judge_env.chat_requests


@pytest.mark.concurrency
def test_the_cap_holds_for_the_run_across_an_interrupt_and_its_resume(prefect_harness, judge_env, tmp_path):
    """--max-requests 40, Ctrl-C after ~24 requests, the same command again: before, each attempt had a fresh
    budget (76 requests paid); now the resumed attempt starts from what the first one reserved, and its budget
    stop counts both attempts' spend once."""
    data = write(tmp_path / "eval.parquet", make_rows(120, seed=9))
    out = tmp_path / "out"
    first = _cli(judge_env, data, out, "--max-requests", "40")
    assert judge_env.wait_for_requests(24, timeout=240), first.communicate()
    first.send_signal(signal.SIGINT)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stdout + stderr
    before = len(judge_env.chat_requests)
    (marker,) = (out / "_pending").glob("*.json")
    run_id = json.loads(marker.read_text())["run_id"]

    rerun = _cli(judge_env, data, out, "--max-requests", "40")
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 5, stdout + stderr  # a budget stop
    sent = len(judge_env.chat_requests)
    (recorded,) = _runs(out)
    print(f"\n[resume] --max-requests 40: {before} requests before Ctrl-C, {sent} in all; "
          f"runs.requests {recorded['requests']}, status {recorded['status']}")  # fmt: skip
    assert sent <= 40
    assert recorded["run_id"] == run_id and recorded["status"] == "budget_exhausted"
    assert recorded["requests"] <= sent  # both attempts' paid rows, once (calls cancelled in flight left no row)
    got = results_of(out, run_id)
    assert len(got) == 120 and sum(r["requests"] for r in got.values()) == recorded["requests"]


def test_a_budget_stopped_run_rerun_with_a_higher_cap_judges_only_what_is_left(prefect_harness, judge_env, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(40, seed=10))
    out = tmp_path / "out"
    stopped = _stopped(judge_env, data, out, max_requests=12, max_concurrency=4)
    assert stopped["status"] == "budget_exhausted" and stopped["requests"] == len(judge_env.chat_requests) <= 12
    first = len(judge_env.chat_requests)
    more = run(judge_env, data, out, max_requests=100, max_concurrency=4)
    again = len(judge_env.chat_requests) - first
    print(f"\n[higher cap] --max-requests 12: {first} requests; then --max-requests 100: {again} more")
    assert more["status"] == "completed" and more["scored"] == 40
    assert again == 40 - stopped["scored"] == more["requests"]


def test_help_and_the_dry_run_say_how_the_caps_hold(prefect_harness, judge_env, tmp_path):
    from typer.testing import CliRunner

    from recall_tasks.cli import app as cli

    data = write(tmp_path / "eval.parquet", make_rows(20, seed=12))
    argv = ["run", data, "-o", str(tmp_path / "out"), "--judge", "openai", "--base-url", judge_env.base_url,
            "--dry-run", "--max-requests", "15", "--max-cost-usd", "0.01"]  # fmt: skip
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, result.output
    (caps,) = [line for line in result.output.splitlines() if line.startswith("caps: ")]
    assert "--max-requests 15 counts every attempt (retries, repairs) before it is sent" in caps
    assert "--max-cost-usd 0.01 reserves each attempt's worst case before it is sent (about $" in caps
    assert "never exceeded" in caps and not judge_env.chat_requests
    text = " ".join(CliRunner().invoke(cli.app, ["run", "--help"], terminal_width=200).output.split())
    assert "each attempt reserves its worst case" in text and "retries and repairs included" in text, text


def test_a_resumed_attempt_takes_over_the_runs_counters_in_prefect(prefect_harness):
    """processes/dask: the counters are named by the run id; a second attempt finds them with what was spent."""
    from prefect.client.orchestration import get_client

    from recall_tasks.config import RunParams
    from recall_tasks.fleet import budget as fleet_budget

    params = RunParams(dataset_uri="d.parquet", task_runner="processes", max_requests=40, max_cost_usd=0.5)
    first = fleet_budget.create_counters(params, "run-resumed")
    with get_client(sync_client=True) as client:
        client.increment_concurrency_slots(names=[first["requests"]], slots=24, mode="concurrency")
    second = fleet_budget.create_counters(params, "run-resumed")
    assert second == first == {"requests": "recall-bench-requests-run-resumed", "cost": "recall-bench-cost-run-resumed"}
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(second["requests"]).active_slots == 24
    fleet_budget.delete_counters(second.values())


def test_an_attempt_that_does_not_fit_waits_for_those_in_flight_then_is_refused():
    import asyncio

    from recall_tasks.fleet.guards import Budget
    from recall_tasks.judges.base import BudgetReached

    async def go() -> None:
        budget = Budget(max_cost_usd=1.0)
        a, b, c = (budget.call(True) for _ in range(3))
        for call in (a, b, c):
            assert await budget.reserve(call)
            call.arm(0.6)
        await a.reserve_attempt()
        waiting = asyncio.ensure_future(b.reserve_attempt())
        await asyncio.sleep(0.01)
        assert not waiting.done()  # 0.6 held + 0.6 > 1.0: b waits for a
        a.settle(0.1)  # a's reply used 0.1 of its 0.6
        await waiting
        third = asyncio.ensure_future(c.reserve_attempt())
        await asyncio.sleep(0.01)
        assert not third.done()  # 0.1 spent + 0.6 held + 0.6 > 1.0: c waits for b
        b.settle(0.5)
        with pytest.raises(BudgetReached, match=r"cost budget reached \(--max-cost-usd 1\)"):
            await third  # 0.6 spent + 0.6 > 1.0 and nothing in flight: not sent
        assert budget.cost_usd == pytest.approx(0.6) and budget.held_usd == 0 and budget.requests == 2

    asyncio.run(go())


@pytest.mark.concurrency
def test_the_cap_holds_across_a_sigkill_and_a_rerun(prefect_harness, judge_env, tmp_path):
    """--max-requests 100, one 200-row chunk, SIGKILL after ~85 paid requests, the same command again: before, the
    ledger was written when a chunk ended, so the rerun started from nothing and paid ~100 more (185 in all); now
    every attempt is held on the store before it is sent, and the rerun starts from what the killed one reserved."""
    data = write(tmp_path / "eval.parquet", make_rows(200, seed=19))
    out = tmp_path / "out"
    judge_env.latency_s = 0.05
    extra = ("--max-requests", "100", "--chunk-size", "500", "--max-concurrency", "8")
    first = _cli(judge_env, data, out, *extra)
    assert judge_env.wait_for_requests(85, timeout=240), first.communicate()
    first.send_signal(signal.SIGKILL)
    first.communicate()
    before = len(judge_env.chat_requests)
    judge_env.latency_s = 0.0
    rerun = _cli(judge_env, data, out, *extra)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 5, stdout + stderr  # a budget stop
    sent = len(judge_env.chat_requests)
    (recorded,) = _runs(out)
    print(f"\n[sigkill] --max-requests 100: {before} requests before the SIGKILL, {sent} in all; "
          f"runs.requests {recorded['requests']}")  # fmt: skip
    assert sent <= 100 + 8  # the cap, and at most the calls in flight at the kill
    assert recorded["status"] == "budget_exhausted" and recorded["requests"] <= 100
