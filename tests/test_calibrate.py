"""``recall-bench calibrate``: judges against human labels, through the real CLI, the real fake OpenAI server
(answering from the labels with a known flip rate, tests/judge_labels.py) and the real table formats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recall_tasks.analysis.agreement import agreement
from recall_tasks.cli.app import app
from recall_tasks.io.labels import load_labels
from recall_tasks.io.maintenance import maintain
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from tests.fake_openai import FakeOpenAI, Status
from tests.judge_labels import LabelJudge

KEY = "sk-test-calibrate-0123456789"
TOPICS = ["Mercury", "Venus", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune", "Pluto", "Ceres", "Vesta"]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"OPENAI_API_KEY": KEY})


def labelled_rows() -> list[dict[str, Any]]:
    """30 rows of 1-3 sentences (60 units: 20 % is exactly 12), both classes in every category."""
    rows = []
    for i in range(30):
        n = 1 + (i % 3)
        topic = TOPICS[i % len(TOPICS)]
        sentences = [f"Fact {k + 1} about {topic} number {i} is known." for k in range(n)]
        rows.append(
            {
                "row_id": f"r{i:02d}",
                "question": f"What about {topic}?",
                "expected_output": " ".join(sentences),
                "contexts": [f"{topic} is a body of the Solar System.", "Unrelated text."],
                "sentences": sentences,
                "labels": [(i + k) % 3 != 0 for k in range(n)],
                "category": ["inner", "outer", "dwarf"][i % 3],
            }
        )
    return rows


@pytest.fixture(scope="module")
def labels_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("labels") / "planets.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in labelled_rows()), encoding="utf-8")
    return str(path)


def query(output: str, sql: str) -> list[dict[str, Any]]:
    result = invoke("query", sql, "--output", output, "--output-format", "json", "--limit", "0")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def implied_kappa(p: float, f: float) -> float:
    """kappa of a judge that flips a share f of units at random, humans saying "supported" for a share p."""
    q = p * (1 - f) + (1 - p) * f
    pe = p * q + (1 - p) * (1 - q)
    return ((1 - f) - pe) / (1 - pe)


@pytest.mark.parametrize("rate", [0.0, 0.2])
def test_calibrate_reports_what_the_flip_rate_implies(
    fake_openai: FakeOpenAI, labels_path: str, tmp_path: Path, rate: float
) -> None:
    labelled = load_labels(labels_path)
    judge = LabelJudge(labelled, rate)
    fake_openai.set_responder(judge)
    output = str(tmp_path / "out")
    result = invoke(
        "calibrate", labels_path, "--judge", "openai:gpt-4o-mini", "--judge", "lexical",
        "--base-url", fake_openai.base_url, "--output", output, "--show-disagreements", "100",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(fake_openai.chat_requests) == 30  # one request per row; the lexical judge calls nothing
    expected = agreement(judge.expected_rows())
    rows = query(output, "SELECT * FROM calibrations WHERE segment_column IS NULL ORDER BY judge")
    assert [r["judge"] for r in rows] == ["lexical", "openai:gpt-4o-mini"]  # side by side, one calibration
    assert rows[0]["calibration_id"] == rows[1]["calibration_id"]
    llm = rows[1]
    assert llm["status"] == "completed" and llm["rows"] == 30 and llm["units"] == 60 and llm["errors"] == 0
    assert llm["accuracy"] == pytest.approx(1.0 - rate) == pytest.approx(expected.accuracy.value)
    assert llm["kappa"] == pytest.approx(expected.kappa.value)
    assert (llm["fp"] + llm["fn"]) == len(judge.flipped) == round(60 * rate)
    p = sum(sum(r["labels"]) for r in labelled_rows()) / 60
    for name, truth in (("accuracy", 1.0 - rate), ("kappa", implied_kappa(p, rate))):
        assert llm[f"{name}_low"] - 1e-9 <= truth <= llm[f"{name}_high"] + 1e-9, (name, llm)
    if rate == 0.0:
        assert llm["kappa"] == 1.0 and llm["disagreements"] == []
    else:
        assert 0.5 < llm["kappa"] < 0.75 and llm["accuracy_low"] < 0.8 < llm["accuracy_high"]
        assert len(llm["disagreements"]) == 12
        assert {d["reason"] for d in llm["disagreements"]} == {"flipped"}  # the judge's own reason
    assert llm["requests"] == 30 and llm["prompt_tokens"] > 0 and llm["cost_usd"] > 0
    lexical = rows[0]
    assert lexical["requests"] == 0 and lexical["units"] == 60 and lexical["judge_model"] == "lexical"
    categories = query(output, "SELECT judge, segment_value, rows FROM calibrations WHERE segment_column = "
                       "'category' ORDER BY judge, segment_value")  # fmt: skip
    assert [(c["segment_value"], c["rows"]) for c in categories] == [("dwarf", 10), ("inner", 10), ("outer", 10)] * 2
    printed = result.stdout
    assert "openai:gpt-4o-mini" in printed and "lexical" in printed
    assert f"{1.0 - rate:.3f} [" in printed  # the accuracy with its interval
    assert "human: supported" in printed and "category dwarf" in printed
    if rate:
        assert "flipped" in printed and "Disagreements (12)" in printed
    reports = sorted(p.name for p in (tmp_path / "out" / "reports").iterdir())
    assert [Path(r).suffix for r in reports] == [".html", ".md"]
    html = (tmp_path / "out" / "reports" / reports[0]).read_text(encoding="utf-8")
    assert "<table>" in html and "openai:gpt-4o-mini" in html and "<script" not in html


def test_a_second_calibration_is_answered_from_the_cache(
    fake_openai: FakeOpenAI, labels_path: str, tmp_path: Path
) -> None:
    fake_openai.set_responder(LabelJudge(load_labels(labels_path), 0.2))
    output = str(tmp_path / "out")
    args = ("calibrate", labels_path, "--model", "gpt-4o-mini", "--base-url", fake_openai.base_url, "-o", output)
    assert invoke(*args).exit_code == 0
    assert len(fake_openai.chat_requests) == 30
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert len(fake_openai.chat_requests) == 30  # nothing judged twice
    rows = query(output, "SELECT requests, cached, accuracy FROM calibrations WHERE segment_column IS NULL "
                 "ORDER BY calibrated_at")  # fmt: skip
    assert [(r["requests"], r["cached"]) for r in rows] == [(30, 0), (0, 30)]
    assert rows[0]["accuracy"] == rows[1]["accuracy"] == pytest.approx(0.8)


def test_rows_without_verdicts_fail_the_calibration(fake_openai: FakeOpenAI, labels_path: str, tmp_path: Path) -> None:
    fake_openai.set_responder(LabelJudge(load_labels(labels_path)))
    fake_openai.enqueue(Status(500), Status(500))
    output = str(tmp_path / "out")
    result = invoke(
        "calibrate", labels_path, "--model", "gpt-4o-mini", "--base-url", fake_openai.base_url, "-o", output,
        "--max-retries", "0", "--max-concurrency", "1", "--no-cache",
    )  # fmt: skip
    assert result.exit_code == 4, result.output
    assert "left rows without verdicts" in result.stderr
    row = query(output, "SELECT status, errors, rows, judged_rows FROM calibrations WHERE segment_column IS NULL")[0]
    assert row == {"status": "failed", "errors": 2, "rows": 30, "judged_rows": 28}


def test_bad_input_is_refused_before_any_judge_call_or_write(
    fake_openai: FakeOpenAI, tmp_path: Path, labels_path: str
) -> None:
    rows = labelled_rows()
    rows[7]["labels"] = [True, False, True, True]  # row 7 has 2 sentences
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    output = tmp_path / "out"
    cases = [
        ((str(bad), "--model", "gpt-4o-mini"), f"error: 4 labels for 2 sentences in the reference, give one label "
         f"per unit, in order (file {bad}, row 7, column 'labels')"),
        ((labels_path, "--judge", "openai:"), "error: --judge 'openai:': expected lexical, openai or openai:MODEL"),
        ((labels_path, "--judge", "lexical", "--judge", "lexical"), "error: judge lexical given twice"),
        ((labels_path, "--metric", "precision"), "error: --metric must be contextual_recall or context_coverage"),
        ((labels_path, "--model", "m", "--max-cost-usd", "1"), "error: --max-cost-usd 1 cannot bound model m"),
    ]  # fmt: skip
    for args, message in cases:
        result = invoke("calibrate", *args, "--base-url", fake_openai.base_url, "-o", str(output))
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message.replace(", give", ": give")), result.stderr
        assert result.stdout == ""
    assert fake_openai.chat_requests == []
    assert not output.exists() or not (output / "calibrations").exists()
    unauthorised = tmp_path / "u"
    fake_openai.models_reply = Status(401)
    result = invoke("calibrate", labels_path, "--model", "gpt-4o-mini", "--base-url", fake_openai.base_url,
                    "-o", str(unauthorised))  # fmt: skip
    assert result.exit_code == 2 and result.stderr.startswith("error:") and KEY not in result.output
    assert fake_openai.chat_requests == [] and not (unauthorised / "calibrations").exists()


@pytest.mark.parametrize("fmt", ["parquet", "iceberg"])
def test_every_table_format_holds_calibrations(labels_path: str, tmp_path: Path, fmt: str) -> None:
    output = str(tmp_path / fmt)
    for _ in range(2):
        result = invoke("calibrate", labels_path, "--judge", "lexical", "-o", output, "--format", fmt)
        assert result.exit_code == 0, result.output
    rows = query(output, "SELECT calibration_id, judge, accuracy, dataset FROM calibrations "
                 "WHERE segment_column IS NULL")  # fmt: skip
    assert len(rows) == 2 and len({r["calibration_id"] for r in rows}) == 2
    assert {r["dataset"] for r in rows} == {"planets"} and rows[0]["accuracy"] == rows[1]["accuracy"]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_maintain_compacts_the_calibrations_table_and_keeps_its_rows(
    labels_path: str, tmp_path: Path, fmt: str
) -> None:
    output = str(tmp_path / fmt)
    for _ in range(3):
        assert invoke("calibrate", labels_path, "--judge", "lexical", "-o", output, "--format", fmt).exit_code == 0
    every_row = "SELECT calibration_id, segment_column, segment_value FROM calibrations ORDER BY ALL"
    before = query(output, every_row)
    store = ResultStore(output, StorageConfig.from_options(), fmt)  # type: ignore[arg-type]
    tables = {row["table"]: row for row in maintain(store)}
    assert "calibrations" in tables
    assert tables["calibrations"]["data_files_after"] < tables["calibrations"]["data_files_before"]
    assert query(output, every_row) == before


def test_labels_and_tables_on_object_storage(
    s3_server: Any, s3_bucket: str, labels_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    s3_server.client().upload_file(labels_path, s3_bucket, "labels/planets.jsonl")
    labels = f"s3://{s3_bucket}/labels/planets.jsonl"
    output = f"s3://{s3_bucket}/recall"
    result = invoke("calibrate", labels, "--judge", "lexical", "-o", output)
    assert result.exit_code == 0, result.output
    assert f"report: {output}/reports/" in result.stderr
    row = query(output, "SELECT labels_uri, units, status FROM calibrations WHERE segment_column IS NULL")
    assert row == [{"labels_uri": labels, "units": 60, "status": "completed"}]
    missing = invoke("calibrate", f"s3://{s3_bucket}/labels/absent.jsonl", "--judge", "lexical", "-o", output)
    assert missing.exit_code == 2 and missing.stderr.startswith("error: labelled set not found")
    assert s3_server.secret_key not in missing.output + result.output


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"])
@pytest.mark.concurrency
def test_an_interrupt_records_nothing_and_the_rerun_completes(
    fake_openai: FakeOpenAI, labels_path: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    fake_openai.set_responder(LabelJudge(load_labels(labels_path)))
    fake_openai.hang = True  # requests are held unanswered: the signal lands with every row in flight
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recall_tasks", "calibrate", labels_path, "--model", "gpt-4o-mini",
           "--base-url", fake_openai.base_url, "-o", str(out)]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": KEY, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert fake_openai.wait_for_requests(10, timeout=60), proc.communicate()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stdout + stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted: nothing recorded"), stderr
    assert "Traceback" not in stderr and stdout == ""
    assert not (out / "calibrations").exists() and not (out / "reports").exists()
    fake_openai.hang = False
    if sig == signal.SIGTERM:
        return  # the rerun is the same for both signals
    again = invoke("calibrate", labels_path, "--model", "gpt-4o-mini", "--base-url", fake_openai.base_url,
                   "-o", str(out))  # fmt: skip
    assert again.exit_code == 0, again.output
    assert query(str(out), "SELECT accuracy FROM calibrations WHERE segment_column IS NULL") == [{"accuracy": 1.0}]
