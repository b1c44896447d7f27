"""Every outcome of a run has its status, its exit code and its Prefect state (issue 38, items 3-5).

A budget stop is ``budget_exhausted`` whatever the error rate of the rows it judged, exit 5, its rows left
unjudged counted ``not_judged``; an incomparable comparison fails ``--fail-on-regression`` with exit 6 unless
``--allow-incomparable``; both end the flow run Failed. ``history`` shows each run's status, and a run whose
earlier runs all failed or were stopped says why it has no baseline. Real components: the CLI (a subprocess where
stderr matters), the fake OpenAI server, Prefect's test server.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from recall_tasks.analysis.baseline import find_baseline
from recall_tasks.cli.app import app
from recall_tasks.errors import ConfigError
from recall_tasks.pipeline.outcome import run_outcome
from tests import judge_script
from tests.test_caching import ROOT, cli_env, write
from tests.test_pipeline import KEY, make_rows
from tests.test_verdicts import runs_of

ROWS, LACKING = 160, 4


def rows_lacking_context() -> list[dict]:
    """160 rows, 4 of them (2.5 %) with no retrieval context: an error each under ``--on-missing error``."""
    rows = make_rows(ROWS, seed=38)
    for i in range(LACKING):
        rows[i * 40 + 7]["contexts"] = []
    return rows


def run_cli(judge: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recall_tasks", "run", *args], env={**cli_env(judge), "COLUMNS": "200"}, cwd=ROOT,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def flow_run_state(flow_run_id: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return flow_run.state


@pytest.fixture
def judge(fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    return fake_openai


@pytest.mark.concurrency
def test_a_budget_stop_is_budget_exhausted_whatever_the_error_rate_exit_5(prefect_harness, judge, tmp_path):
    """The issue's case: --max-requests 20 on 160 rows, 4 lacking context: 4 of 24 assessed rows in error (16.7 %)
    read ``failed``, exit 4, and nothing said the budget stopped the run."""
    data = write(tmp_path / "eval.parquet", rows_lacking_context())
    out = str(tmp_path / "out")
    llm = ("--judge", "openai", "--base-url", judge.base_url)
    done = run_cli(judge, data, "-o", out, *llm, "--max-requests", "20")
    assert done.returncode == 5, done.stdout + done.stderr
    assert len(judge.chat_requests) == 20
    budget_lines = [line for line in done.stderr.splitlines() if "budget" in line]
    assert budget_lines == [
        "budget exhausted: request budget reached (--max-requests 20): 136 of 160 rows not judged; 4 of 24 "
        "assessed rows ended with an error (16.7%, above --max-error-rate 0.05); results committed (status "
        "budget_exhausted); the next run judges the rest"
    ], done.stderr
    assert not re.search(r"^run \S+ failed: ", done.stderr, re.M) and "4 row(s) ended with an error" in done.stderr
    (run,) = runs_of(out)
    assert run["status"] == "budget_exhausted" and run["status_reason"].startswith(
        "request budget reached (--max-requests 20): 136 of 160 rows not judged"
    )
    # the error rate is still reported: over the rows the run assessed (judged, or failed on their inputs)
    assert (
        run["error_rate"] == pytest.approx(4 / 24)
        and "4 of 24 assessed rows ended with an error" in (run["status_reason"])
    )
    assert (run["not_judged"], run["skipped"], run["errors"], run["scored"]) == (136, 0, 4, 20)
    state = flow_run_state(run["flow_run_id"])  # not Completed: a partial run must not look done and fine
    assert state.is_failed() and "budget" in (state.message or ""), state
    # the same rows are 2.5 % of the dataset: the full run completes; the budget-stopped run is no baseline
    judge.reset()
    judge.set_responder(judge_script.responder)
    full = run_cli(judge, data, "-o", out, *llm)
    assert full.returncode == 0, full.stdout + full.stderr
    assert len(judge.chat_requests) == ROWS - LACKING - 20  # the 20 judged rows came from the row cache
    assert "no comparable baseline (1 earlier run: 1 budget_exhausted)" in full.stdout, full.stdout
    (second,) = [r for r in runs_of(out) if r["run_id"] != run["run_id"]]
    assert second["status"] == "completed" and second["error_rate"] == pytest.approx(LACKING / ROWS)
    assert second["not_judged"] == 0


def test_history_shows_each_status_and_why_a_run_has_no_baseline(prefect_harness, judge, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(30, seed=5))
    out = str(tmp_path / "out")
    llm = ["--judge", "openai", "--base-url", judge.base_url, "--max-retries", "0"]
    judge.set_responder(lambda body: {"status": 503, "content": ""})
    assert cli("run", data, "-o", out, *llm, "--label", "down").exit_code == 4
    judge.set_responder(judge_script.responder)
    stopped = cli("run", data, "-o", out, *llm, "--label", "stopped", "--max-requests", "5")
    assert stopped.exit_code == 5, stopped.output
    assert "no comparable baseline (1 earlier run: 1 failed)" in stopped.output, stopped.output
    first_good = cli("run", data, "-o", out, *llm, "--label", "good")
    assert first_good.exit_code == 0, first_good.output
    shown = "no comparable baseline (2 earlier runs: 1 failed / 1 budget_exhausted)"
    assert shown in first_good.output and "first run of its series" not in first_good.output, first_good.output
    runs = {r["label"]: r for r in runs_of(out)}
    # an explicit --baseline may name a budget-stopped run (its judged rows are compared); latest never picks one
    explicit = cli("run", data, "-o", out, *llm, "--label", "vs-stopped", "--baseline", runs["stopped"]["run_id"])
    assert explicit.exit_code == 0, explicit.output
    assert f"vs baseline {runs['stopped']['run_id']}: " in explicit.output, explicit.output
    runs = {r["label"]: r for r in runs_of(out)}
    table = cli("history", "-o", out)
    assert table.exit_code == 0, table.output
    header = next(line for line in table.output.splitlines() if "run_id" in line)
    assert re.search(r"run_id\s+.\s+status\b", header), header
    lines = {label: next(x for x in table.output.splitlines() if runs[label]["run_id"] in x) for label in runs}
    assert "failed" in lines["down"] and "not compared (failed run)" in lines["down"], lines["down"]
    assert (
        "budget_exhausted" in lines["stopped"]
        and "no comparable baseline (1 earlier run: 1 failed)" in (lines["stopped"])
    )
    assert "completed" in lines["good"] and shown in lines["good"], lines["good"]
    assert f"vs {runs['stopped']['run_id']}" in lines["vs-stopped"]
    as_json = cli("history", "-o", out, "--output-format", "json")
    records = {r["label"]: r for r in map(json.loads, as_json.output.splitlines())}
    assert {k: v["status"] for k, v in records.items()} == {
        "down": "failed", "stopped": "budget_exhausted", "good": "completed", "vs-stopped": "completed",
    }  # fmt: skip
    assert records["good"]["verdict"] is None and records["good"]["reason"] == shown


def test_incomparable_fails_fail_on_regression_with_exit_6_unless_allowed(prefect_harness, judge, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(20, seed=9))
    out = str(tmp_path / "out")
    llm = ["--judge", "openai", "--base-url", judge.base_url]
    assert cli("run", data, "-o", out, *llm, "--label", "a").exit_code == 0
    allowed = cli("run", data, "-o", out, "--label", "b", "--fail-on-regression", "--allow-incomparable")
    assert allowed.exit_code == 0, allowed.output
    assert ": incomparable (" in allowed.output and "judge differs" in allowed.output
    gated = cli("run", data, "-o", out, *llm, "--model", "gpt-4o", "--label", "c", "--fail-on-regression")
    assert gated.exit_code == 6, gated.output
    found = re.search(r"^incomparable: run \S+ is not comparable with its baseline (\S+): judge differs", gated.output,
                      re.M)  # fmt: skip
    assert found, gated.output
    assert "--allow-incomparable" in gated.output
    runs = {r["label"]: r for r in runs_of(out)}
    assert runs["c"]["status"] == "completed"  # the run itself completed: the gate is the flag's
    state = flow_run_state(runs["c"]["flow_run_id"])
    assert state.is_failed() and "incomparable" in (state.message or ""), state
    assert flow_run_state(runs["b"]["flow_run_id"]).is_completed()
    # without --fail-on-regression an incomparable run exits 0, as before
    again = cli("run", data, "-o", out, *llm, "--model", "gpt-4.1-mini", "--label", "d")
    assert again.exit_code == 0 and ": incomparable (" in again.output, again.output


@pytest.mark.concurrency
def test_a_budget_stop_before_the_canary_says_the_canary_was_not_checked(prefect_harness, judge, tmp_path):
    from tests.test_canary import labelled, write_jsonl

    rows = make_rows(12, seed=21)
    data = write(tmp_path / "eval.parquet", rows)
    canary = write_jsonl(tmp_path / "canary.jsonl", labelled(make_rows(6, seed=22)))
    out = str(tmp_path / "out")
    done = run_cli(judge, data, "-o", out, "--judge", "openai", "--base-url", judge.base_url, "--canary", canary,
                   "--max-requests", "12", "--max-concurrency", "1")  # fmt: skip
    assert done.returncode == 5, done.stdout + done.stderr
    assert len(judge.chat_requests) == 12  # every dataset row, nothing left for the canary
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("budget exhausted:")]
    assert "0 of 12 rows not judged" in line and "the canary was not checked (none of its 6 rows judged)" in line
    assert re.search(r"canary\s+\W\s+not checked: none of its 6 rows got a verdict", done.stdout), done.stdout
    (run,) = runs_of(out)
    assert run["status"] == "budget_exhausted" and run["canary_rows"] == 0 and run["canary_errors"] == 6
    assert run["not_judged"] == 0 and run["scored"] == 12


def test_the_exit_codes_are_one_table_in_run_help_too():
    for path in ([], ["run"]):
        output = CliRunner().invoke(app, [*path, "--help"], terminal_width=78).output
        assert re.findall(r"^\s{2,}(\d+)\s{2,}\S", output, re.M) == ["0", "2", "3", "4", "5", "6", "7", "130"], output


# -- the rules as pure functions ---------------------------------------------------------------------------------


def _plan(budget: str | None = None, breaker: str | None = None) -> Any:
    return SimpleNamespace(
        params=SimpleNamespace(max_error_rate=0.05),
        budget=SimpleNamespace(exhausted_reason=budget),
        breaker=SimpleNamespace(tripped_reason=breaker),
    )


STATS = {"rows": 160, "errors": 4, "skipped": 0, "not_judged": 136}


@pytest.mark.parametrize(
    ("budget", "breaker", "status"),
    [
        ("request budget reached (--max-requests 20)", None, "budget_exhausted"),
        (None, None, "failed"),
        ("request budget reached (--max-requests 20)", "judge endpoint down", "failed"),
    ],
)
def test_the_budget_wins_over_the_error_rate_an_outage_over_the_budget(budget, breaker, status):
    outcome = run_outcome(_plan(budget, breaker), ("boom", 4), STATS)
    assert outcome["status"] == status
    assert outcome["error_rate"] == pytest.approx(4 / 24)  # the rows not judged are in neither count


def test_rows_not_judged_are_not_skipped_rows():
    stats = {"rows": 160, "errors": 4, "skipped": 60, "not_judged": 0}
    assert run_outcome(_plan(), ("boom", 4), stats)["error_rate"] == pytest.approx(4 / 100)


RUNS = pa.Table.from_pylist(
    [
        {"run_id": "r1", "dataset": "d", "metric": "contextual_recall", "status": "completed", "label": "x",
         "finished_at": 1, "segment_column": None},
        {"run_id": "r2", "dataset": "d", "metric": "contextual_recall", "status": "budget_exhausted", "label": "y",
         "finished_at": 2, "segment_column": None},
        {"run_id": "r3", "dataset": "d", "metric": "contextual_recall", "status": "failed", "label": "y",
         "finished_at": 3, "segment_column": None},
    ]
)  # fmt: skip


def test_a_budget_stopped_run_is_a_baseline_only_when_named():
    def pick(spec: str) -> str | None:
        row = find_baseline(RUNS, dataset="d", metric="contextual_recall", spec=spec)
        return None if row is None else row["run_id"]

    assert pick("latest") == "r1"  # r2 is more recent, but stopped by its budget
    assert pick("r2") == pick("run:r2") == "r2"
    with pytest.raises(ConfigError, match="no completed run labelled 'y'"):
        pick("label:y")
    with pytest.raises(ConfigError, match="has status 'failed'"):
        pick("r3")


def test_a_narrow_history_keeps_a_status_other_than_completed_in_the_verdict():
    from recall_tasks.cli.history_fit import history_fit
    from recall_tasks.cli.output import HISTORY_COLUMNS

    def row(run_id: str, status: str, verdict: str) -> list[str]:
        return ["2026-12-04 05:00", "eval", "nightly", run_id, status, "gpt-4o-mini", "160", "0.500", "0.4..0.6",
                "60.0% ≥0.5", verdict]  # fmt: skip

    cells = [row("20261204T050000Z-aaaaaa", "budget_exhausted", "regressed vs 20261203T050000Z-bbbbbb"),
             row("20261204T060000Z-cccccc", "completed", "unchanged vs 20261204T050000Z-aaaaaa")]  # fmt: skip
    names, rows = history_fit(list(HISTORY_COLUMNS), cells, 60)
    assert "status" not in names
    assert [r[names.index("verdict")] for r in rows] == ["budget_exhausted: regressed", "unchanged"]


def test_a_narrow_history_keeps_why_a_run_is_incomparable():
    """Narrowed, the verdict loses the baseline id and parentheses, not the reason (was: the bare "incomparable",
    on any terminal narrower than the whole table: 284 columns for the laptop recipe's history)."""
    from recall_tasks.cli.history_fit import history_fit
    from recall_tasks.cli.output import HISTORY_COLUMNS, history_cells, width_needed

    def rec(run_id: str, verdict: str | None, reason: str | None) -> dict[str, object]:
        return {"started_at": None, "dataset": "golden", "label": "nightly", "run_id": run_id, "status": "completed",
                "judge": "gpt-4o-mini", "rows": 11, "mean_score": 0.5, "ci_low": 0.4, "ci_high": 0.6, "pass_rate": 0.6,
                "threshold": 0.5, "verdict": verdict, "baseline_run_id": "20261204T111935Z-0bccca",
                "reason": reason}  # fmt: skip

    reasons = "judge differs (current 'lexical', baseline 'openai'); threshold differs (current 0.5, baseline 0.7)"
    cells = [history_cells(rec("20261204T111935Z-0bccca", None, "first run of its series")),
             history_cells(rec("20261204T111958Z-4d5699", "incomparable", reasons)),
             history_cells(rec("20261204T120000Z-aaaaaa", "regressed", None))]  # fmt: skip
    names, rows = history_fit(list(HISTORY_COLUMNS), cells, 150)
    assert [r[names.index("verdict")] for r in rows] == [
        "first",
        "incomparable: judge differs; +1 more (--output-format json)",
        "regressed",
    ]
    assert width_needed(names, rows) <= 150 and "run_id" in names
    names, rows = history_fit(list(HISTORY_COLUMNS), cells, 130)
    assert rows[1][names.index("verdict")] == "incomparable: judge differs; +1 more (--output-format json)"
    assert width_needed(names, rows) <= 130
    names, rows = history_fit(list(HISTORY_COLUMNS), cells, 80)  # no column left to drop: the bare word
    assert [r[names.index("verdict")] for r in rows] == ["first", "incomparable", "regressed"]
