"""Alerts end to end: `recall-bench alerts install` on a real Prefect server, real runs, a real webhook receiver.

No mocks: ``prefect server start`` (its triggers, actions and event persister services on, as by default) gets the
automation of ``deployments/alerts.yaml`` through ``recall-bench alerts install --webhook-url`` (a custom webhook
block whose URL is a secret, pointing at :mod:`tests.webhook_receiver`); then ``recall-bench run`` processes
talking to that server score small datasets: a baseline, a run that regresses, an unchanged one and one whose
judge changed (lexical, then the fake OpenAI judge), one whose judge endpoint fails (exit 4), one stopped by
``--max-requests``. The Prefect server renders each message from the event and posts it through the block: the
receiver must get exactly one message per alerting run, with the right fields, within a minute, and nothing for
the baseline and the unchanged run. The webhook URL must appear in no event, no automation and no output.

The escaping of dataset text is checked on the message as delivered (rendered with markdown-it, raw HTML on).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from markdown_it import MarkdownIt

from recall_tasks.reports import alerts
from tests import judge_script
from tests import prefect_server as _prefect
from tests import webhook_receiver as _receiver
from tests.fake_openai import FakeOpenAI, Status
from tests.prefect_server import REPO, PrefectServer
from tests.webhook_receiver import WebhookReceiver

prefect_server = _prefect.prefect_server
webhook_receiver = _receiver.webhook_receiver

KEY = "sk-alerts-SECRET-0123456789abcdef"
TOKEN = "T0KEN-never-shown-4f1c9a"
DELIVERY_S = 60.0
QUIET_S = 8.0
HOSTILE = [
    "The <script>alert(1)</script> vault opens at dawn.",
    "Click [here](javascript:alert(1)) for the *bold* _claim_ about `code` and ![x](http://attacker.test/b.png).",
    "The <@U123> mention and <!channel> ping reach everyone & more.",
    "Paris is the capital of France.",
]


def _rows(contexts: bool, n: int = 8) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        truth = HOSTILE[i % len(HOSTILE)]
        rows.append(
            {
                "row_id": f"r{i:02d}",
                "question": f"Question {i}?",
                "ground_truth": truth,
                "contexts": [truth if contexts else "Unrelated text about cooking pasta.", "filler chunk"],
                "category": "ab"[i % 2],
            }
        )
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


#: the CLI processes a test started, reaped after it (:func:`_reap_cli_processes`)
_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap_cli_processes() -> Iterator[None]:
    """A test that fails while its CLI processes run leaves them and their pipes behind: killed and reaped here,
    so that the next test's garbage check does not report them as its own (make test-flaky N=3: an ERROR at
    the teardown of test_token_quota after a failed run of the test below)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _cli(server: PrefectServer, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = server.env(PYTHONPATH=str(REPO), OPENAI_API_KEY=KEY, **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "recall_tasks", *args], env=full, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _STARTED.append(proc)
    return proc


def _done(proc: subprocess.Popen[str], what: str, code: int) -> str:
    out, errs = proc.communicate(timeout=240)
    assert proc.returncode == code, f"{what}: exit {proc.returncode}, expected {code}\n{out}\n{errs}"
    return out + errs


def _events(server: PrefectServer, event_filter: dict[str, Any]) -> list[dict[str, Any]]:
    """Every stored event matching ``event_filter`` (all pages)."""
    body = json.dumps({"filter": event_filter, "limit": 50}).encode()
    request = urllib.request.Request(
        f"{server.api_url}/events/filter", data=body, headers={"Content-Type": "application/json"}
    )
    found: list[dict[str, Any]] = []
    while True:
        with urllib.request.urlopen(request, timeout=10) as resp:
            page = json.loads(resp.read())
        found += page["events"]
        if not page.get("next_page"):
            return found
        request = urllib.request.Request(page["next_page"])


def _named(server: PrefectServer, names: list[str]) -> list[dict[str, Any]]:
    return _events(server, {"event": {"name": names}})


def _markup(message: str) -> set[str]:
    """The HTML tags a permissive Markdown viewer makes of ``message`` (raw HTML on), and its links."""
    rendered = MarkdownIt("commonmark", {"html": True}).render(message)
    return set(re.findall(r"<([a-z][a-z0-9]*)", rendered))


@pytest.mark.timeout(600)  # 10 CLI processes on 2 shared cores: 160-230 s at load 15-20, 400 s beside test-fast
def test_alerts_reach_the_webhook_once_per_alerting_run(
    prefect_server: PrefectServer, webhook_receiver: WebhookReceiver, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    hook = f"{webhook_receiver.url}/hooks/{TOKEN}"
    # ---- install from the shipped definition, twice: one automation, updated in place (listed meanwhile)
    install = ["alerts", "install", "--webhook-url", hook]
    first = _done(_cli(prefect_server, *install), "alerts install", 0)
    # again, through the block the first install saved (by its bare name): the same automation, updated
    again = _cli(prefect_server, "alerts", "install", "--block", "recall-bench-alerts")
    listing = _cli(prefect_server, "alerts", "list")
    # one team's route: the budget_* datasets also go to the team's own webhook
    team = _cli(
        prefect_server, "alerts", "install", "--webhook-url", f"{webhook_receiver.url}/hooks/team-budget",
        "--block-name", "team-budget", "--dataset", "budget*",
    )  # fmt: skip
    second = _done(again, "alerts install (again)", 0)
    assert "updated automation recall-bench-alerts" in second, second
    for out in (first, second):
        assert "recall-bench-alerts" in out and TOKEN not in out and webhook_receiver.url not in out, out
    assert "created automation" in first and "updated automation" not in first, first
    listed = _done(listing, "alerts list", 0)
    assert "created automation recall-bench-alerts-budget*" in _done(team, "alerts install --dataset", 0)
    assert "custom-webhook/recall-bench-alerts" in listed and TOKEN not in listed, listed
    with prefect_server.client() as client:
        (automation,) = client.read_automations_by_name("recall-bench-alerts")
        assert automation.enabled and set(automation.trigger.expect) == set(alerts.ALERT_EVENTS.values())
        assert TOKEN not in automation.model_dump_json()
        block = client.read_block_document(automation.actions[0].block_document_id, include_secrets=False)
        assert TOKEN not in json.dumps(block.data, default=str)

    # ---- the runs: three chains at once (lexical series; failing judge; budget)
    series = tmp_path / "data" / "nightly_golden.parquet"
    out_dir = tmp_path / "out"
    common = ["--output", str(out_dir), "--label", "nightly", "--segment-by", "category", "--chunk-size", "4"]
    failing = FakeOpenAI().start()
    judge = FakeOpenAI(judge_script.responder).start()
    try:
        failing.enqueue(*[Status(500) for _ in range(200)])
        failed = _cli(
            prefect_server, "run", _write(tmp_path / "data" / "failing_set.parquet", _rows(True)), *common,
            "--judge", "openai", "--base-url", failing.base_url, "--max-retries", "1", "--no-cache",
        )  # fmt: skip
        budget = _cli(
            prefect_server, "run", _write(tmp_path / "data" / "budget_set.parquet", _rows(True)), *common,
            "--judge", "openai", "--base-url", judge.base_url, "--max-requests", "3", "--max-concurrency", "1",
            "--no-cache",  # the same rows as the failing run's: neither takes the other's judged rows
        )  # fmt: skip
        _write(series, _rows(True, 12))  # a verdict needs 10 paired rows (below: too_few_rows, no alert)
        _done(_cli(prefect_server, "run", str(series), *common, "--judge", "lexical"), "baseline", 0)
        _write(series, _rows(False, 12))  # the same rows, their contexts lost: recall drops
        lexical = ["run", str(series), *common, "--judge", "lexical"]
        _done(_cli(prefect_server, *lexical), "regressed", 0)
        _done(_cli(prefect_server, "run", str(series), *common, "--judge", "lexical"), "unchanged", 0)
        _done(
            _cli(prefect_server, "run", str(series), *common, "--judge", "openai", "--base-url", judge.base_url),
            "judge changed", 0,
        )  # fmt: skip
        failed_out = _done(failed, "failing judge", 4)
        _done(budget, "budget", 5)
    finally:
        failing.stop()
        judge.stop()
    assert re.search(r"^run \S+ failed: ", failed_out, re.M), failed_out  # said once: not "run failed: run ..."
    t_runs = time.monotonic()

    # ---- the messages: one per alerting run, within a minute
    webhook_receiver.wait_for(5, DELIVERY_S)
    time.sleep(QUIET_S)  # nothing more comes (the baseline and the unchanged run are quiet)
    removing = _cli(prefect_server, "alerts", "remove", "recall-bench-alerts-budget*")
    routed = [g for g in webhook_receiver.received if g.path == "/hooks/team-budget"]
    assert [_kind_of(g.json["subject"]) for g in routed] == ["budget_exhausted"], [g.json for g in routed]
    got = [g for g in webhook_receiver.received if g not in routed]
    bodies = [g.json for g in got]
    print("\n" + "\n\n".join(json.dumps(b, indent=2, ensure_ascii=False) for b in bodies))
    assert len(got) == 4, [b.get("subject") for b in bodies]
    by_subject = {_kind_of(b["subject"]): g for b, g in zip(bodies, got, strict=True)}
    assert set(by_subject) == {"regressed", "incomparable", "failed", "budget_exhausted"}, by_subject.keys()
    assert all(g.path == f"/hooks/{TOKEN}" and g.json["source"] == "recall-bench" for g in got)
    alert_events = _named(prefect_server, list(alerts.ALERT_EVENTS.values()))
    occurred = {e["payload"]["kind"]: dt.datetime.fromisoformat(e["occurred"]).timestamp() for e in alert_events}
    for kind, received in by_subject.items():
        print(f"  {kind:<17} delivered {received.at - occurred[kind]:5.1f} s after its event")
        assert 0 < received.at - occurred[kind] < DELIVERY_S, kind
    print(f"  install + runs {t_runs - t0:5.1f} s, server start {prefect_server.startup_seconds or 0:.1f} s")

    regressed = by_subject["regressed"].json
    assert "nightly\\_golden" in regressed["subject"] and "(label nightly)" in regressed["subject"]
    text = regressed["text"]
    assert "Mean 0.000 (95 % CI" in text and "vs baseline 1.000" in text, text
    assert "pass→fail flips: 12" in text and "Segments that moved most:" in text, text
    assert "- category = a: -1.000 over 6 rows" in text, text
    assert text.count("\n- `r0") == 3, text  # the three rows that lost most
    assert "“The &lt;script&gt;alert\\(1\\)&lt;/script&gt; vault opens at dawn.”" in text, text
    assert "Report: `" in text and ".html`" in text, text
    assert _markup(text) <= {"p", "strong", "ul", "li", "code"}, _markup(text)
    for message in (b["text"] for b in bodies):
        assert _markup(message) <= {"p", "strong", "ul", "li", "code"}, message

    incomparable = by_subject["incomparable"].json["text"]
    assert "judge differs (current 'openai', baseline 'lexical')" in _plain(incomparable), incomparable
    failed_text = by_subject["failed"].json["text"]
    assert "failing\\_set" in failed_text, failed_text  # 8 rows x 2 attempts: the breaker trips at 10 in a row
    assert "judge endpoint 127.0.0.1:" in _plain(failed_text) and "attempts in a row" in failed_text, failed_text
    assert "Rows 8: 0 scored, " in failed_text, failed_text  # with an error or not judged, as the breaker found them
    budget_text = by_subject["budget_exhausted"].json["text"]
    assert "Reason: request budget reached (--max-requests 3)" in _plain(budget_text), budget_text
    assert "Rows 8: 3 scored, 0 with an error, 0 skipped, 5 not judged" in budget_text, budget_text

    # ---- the events: one alert per run, the figures as data, never the webhook URL or the judge key
    assert sorted(e["event"] for e in alert_events) == sorted(alerts.ALERT_EVENTS.values())
    detected = next(e for e in alert_events if e["event"] == "recall.regression.detected")
    assert detected["resource"]["recall.dataset"] == "nightly_golden"
    assert detected["resource"]["recall.label"] == "nightly"
    payload = detected["payload"]
    assert payload["verdict"] == "regressed" and payload["flips"]["pass_to_fail"] == 12
    assert payload["baseline"]["mean"] == 1.0 and len(payload["worst_rows"]) == 3
    assert payload["worst_rows"][0]["lost"] == [HOSTILE[0]]
    assert payload["report_uri"].endswith(".html")
    completed = _named(prefect_server, ["recall.run.completed"])
    assert len(completed) == 6
    everything = json.dumps(_events(prefect_server, {}))
    assert TOKEN not in everything and KEY not in everything
    assert "removed automation recall-bench-alerts-budget*" in _done(removing, "alerts remove", 0)
    with prefect_server.client() as client:
        assert [a.name for a in client.read_automations()] == ["recall-bench-alerts"]
    assert not prefect_server.automation_failures()


def _plain(message: str) -> str:
    """A message's text as a reader sees it: backslash escapes and entities undone."""
    return html.unescape(re.sub(r"\\(.)", r"\1", message))


def _kind_of(subject: str) -> str:
    for kind, title in alerts.TITLES.items():
        if subject.startswith(title + ":"):
            return kind
    raise AssertionError(f"unexpected subject {subject!r}")


# ------------------------------------------------------------------------------------- without a server


def _summary(status: str = "completed", **kw: Any) -> dict[str, Any]:
    row = {
        "run_id": "cur",
        "dataset": "faq_<b>x</b>",
        "label": "night*ly",
        "status": status,
        "status_reason": None,
        "rows": 5,
        "scored": 5,
        "errors": 0,
        "skipped": 0,
        "mean_score": 0.5,
        "ci_low": 0.4,
        "ci_high": 0.6,
    }
    return {**row, **kw}


def _comparison(current: list[float], baseline: list[float]) -> Any:
    from recall_tasks.analysis.regression import compare_runs
    from tests.test_regression import results, run_row

    ids = [f"r{i}" for i in range(len(current))]
    return compare_runs(
        results("cur", ids, current), results("base", ids, baseline), current_run=run_row("cur"),
        baseline_run=run_row("base", mean_score=0.9, ci_low=0.8, ci_high=1.0), resamples=200,
    )  # fmt: skip


def test_quiet_runs_send_no_alert_and_each_kind_its_own_event() -> None:
    same = [0.0, 0.25, 0.5, 0.75, 1.0] * 4
    assert alerts.alert_for_run(_summary(), None, "r.html") is None  # the first run of a series
    assert alerts.alert_for_run(_summary(), _comparison(same, same), "r.html") is None  # unchanged
    assert alerts.alert_for_run(_summary(), _comparison([1.0] * 20, [0.0] * 20), "r.html") is None  # improved
    regressed = _comparison([0.0] * 20, [1.0] * 20)
    assert regressed.verdict == "regressed"
    found = alerts.alert_for_run(_summary(threshold=0.6), regressed, "s3://b/reports/cur.html")
    assert found is not None and found.name == "recall.regression.detected"
    assert "pass→fail flips: 20 (fail→pass 0); a pass is a score of at least 0.6." in found.payload["message"]
    assert found.payload["baseline"] == {"run_id": "base", "mean": 0.9, "mean_ci": [0.8, 1.0]}
    assert found.resource["recall.dataset"] == "faq_<b>x</b>" and found.resource["recall.label"] == "night*ly"
    # a failed or budget-stopped run is one message of its own kind, whatever its verdict
    failed = alerts.alert_for_run(_summary("failed", status_reason="breaker tripped"), None, None)
    assert failed is not None and failed.name == "recall.run.failed" and failed.payload["reason"] == "breaker tripped"
    stopped = alerts.alert_for_run(_summary("budget_exhausted", status_reason="cost budget"), regressed, None)
    assert stopped is not None and stopped.name == "recall.run.budget_exhausted"
    assert stopped.payload["verdict"] == "regressed"  # the comparison still rides along


def test_dataset_text_never_becomes_markup_in_the_message() -> None:
    died = alerts.alert_for_worker_death(
        "set_[a](http://x.test)", "run1", "<img src=x onerror=alert(1)>", "/d/x.parquet", "a worker process died"
    )
    subject, message = died.payload["subject"], died.payload["message"]
    assert _markup(message) <= {"p", "strong", "code"}, message
    assert "\n" not in subject and "<img" not in subject and "](" not in subject
    assert "set\\_\\[a\\]\\(http://x.test\\)" in subject, subject
    assert "Nothing was committed" in message


# ----------------------------------------------------------------------- the commands' own output and errors


def _alerts_cli(*args: str, env: dict[str, str] | None = None) -> Any:
    from typer.testing import CliRunner

    from recall_tasks.cli.app import app

    return CliRunner().invoke(app, ["alerts", *args], env={"COLUMNS": "400", **(env or {})})


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [["list"], ["remove"], ["remove", "recall-bench-alerts"], ["install", "--block", "recall-bench-alerts"]],
    ids=["list", "remove-the-file's", "remove-by-name", "install"],
)
def test_alerts_commands_without_a_reachable_prefect_api_say_so_in_one_line(args: list[str]) -> None:
    """Before: ``list`` and ``remove`` ended with a ServerError traceback and exit 1 (``install`` said one line)."""
    url = f"http://127.0.0.1:{_prefect.free_port()}/api"  # nothing listens there
    line = _one_error_line(_alerts_cli(*args, env={"PREFECT_API_URL": url}))
    assert f"the Prefect API at {url} (PREFECT_API_URL) cannot be reached" in line, line


def test_alert_names_are_printed_as_given_and_an_empty_dataset_is_refused(prefect_harness, tmp_path: Path) -> None:
    """Names with brackets print whole (Rich markup ate ``[ab]``); ``--dataset ''`` changes nothing (it used to
    update the automation of every dataset)."""
    from prefect.client.orchestration import get_client

    yaml_text = (REPO / "deployments" / "alerts.yaml").read_text(encoding="utf-8")
    definition = yaml_text.replace("name: recall-bench-alerts", "name: spend-test-alerts")
    file = tmp_path / "alerts.yaml"
    file.write_text(definition, encoding="utf-8")
    hook = ["--webhook-url", "http://127.0.0.1:9/hooks/x", "--block-name", "spend-test-hook", "--file", str(file)]

    installed = _alerts_cli("install", *hook, "--dataset", "[ab]*")
    assert installed.exit_code == 0, installed.output
    assert "created automation spend-test-alerts-[ab]* (" in installed.output, installed.output
    assert "'recall.dataset': '[ab]*'" in installed.output, installed.output  # the listing of its trigger
    listed = _alerts_cli("list")
    assert listed.exit_code == 0 and "spend-test-alerts-[ab]*  " in listed.output, listed.output

    line = _one_error_line(_alerts_cli("install", *hook, "--dataset", ""))
    assert "--dataset '': an empty pattern; omit --dataset for the automation on every dataset" in line, line
    with get_client(sync_client=True) as client:
        assert client.read_automations_by_name("spend-test-alerts") == []  # the every-dataset one: not created
        assert len(client.read_automations_by_name("spend-test-alerts-[ab]*")) == 1

    removed = _alerts_cli("remove", "spend-test-alerts-[ab]*")
    assert removed.exit_code == 0 and removed.output.strip() == "removed automation spend-test-alerts-[ab]*", (
        removed.output
    )
    with get_client(sync_client=True) as client:
        assert client.read_automations_by_name("spend-test-alerts-[ab]*") == []
