"""Dataset text never drives the terminal (issue 39, item 2): escape sequences in row ids, segment values,
references and labels are shown escaped by ``query`` (table, and csv/markdown/json on a terminal), ``history``,
the run summary and the logs; written to a pipe or a file, csv and json keep the exact bytes.

The tables come from a real run (``recall-bench run`` through Prefect, offline judge); the terminal is a real
pseudo-terminal the CLI subprocess writes to.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recall_tasks._logging import OneLineArgs, inert
from recall_tasks.cli.app import app
from tests.test_pipeline import make_rows
from tests.test_tracking import write

CLEAR = "\x1b[2J"  # a row id that is only an escape sequence: clears the screen
TITLE = "\x1b]0;pwned\x07"  # OSC: sets the window title
LINK = "\x1b]8;;https://evil.example/\x1b\\click here\x1b]8;;\x1b\\"  # OSC 8: a hyperlink
RED = "\x1b[31mred\x1b[0m"  # colours
C1 = "\x9b2J"  # the one-byte CSI: clears the screen on terminals that honour C1
LABEL = f"{TITLE}v2"
#: What must never reach a terminal raw (Rich's own styling may add other ESC sequences: those are not data).
RAW = (CLEAR, "\x1b]0;", "\x1b]8;;", "\x1b[31m", "\x9b")
ROOT = Path(__file__).resolve().parents[1]


def rows() -> list[dict[str, Any]]:
    out = make_rows(12, seed=5)
    out[0]["row_id"] = CLEAR
    out[1]["row_id"] = f"q{C1}1"
    for i, r in enumerate(out):
        r["category"] = RED if i % 2 else "plain"
    out[2]["ground_truth"] = f"{LINK} {out[2]['ground_truth']}"
    return out


@pytest.fixture(scope="module")
def out(prefect_harness, tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("escapes")
    data = write(tmp / "eval.parquet", rows())
    output = str(tmp / "out")
    run = CliRunner().invoke(app, ["run", data, "-o", output, "--label", LABEL, "--segment-by", "category"])
    assert run.exit_code == 0, run.output
    return {"output": output, "run": run}


def on_terminal(*args: str) -> str:
    """What ``recall-bench ARGS`` writes to a terminal (its stdout is a pseudo-terminal)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "250", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "recall_tasks", *args], stdout=follower, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    return b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


def assert_inert(shown: str) -> None:
    for raw in RAW:
        assert raw not in shown, (raw, shown)


# ------------------------------------------------------------------------------ the rule


def test_inert_shows_control_characters_escaped_and_keeps_the_rest() -> None:
    assert inert(CLEAR) == "\\x1b[2J"
    assert inert(TITLE) == "\\x1b]0;pwned\\x07"
    assert inert(LINK) == "\\x1b]8;;https://evil.example/\\x1b\\click here\\x1b]8;;\\x1b\\"
    assert inert(C1) == "\\x9b2J" and inert("\x7f") == "\\x7f" and inert("a\rb\x00") == "a\\rb\\x00"
    assert inert("two\nlines\tand a tab") == "two\nlines\tand a tab"  # a table cell keeps its lines
    assert inert("two\nlines\t", lines=False) == "two\\nlines\\t"
    plain = "Ünïcode, 東京, emoji 👍, a back\\slash"
    assert inert(plain) is plain
    assert inert(inert(LINK)) == inert(LINK)  # what it shows holds no control character


def test_a_logged_value_is_escaped_too() -> None:
    record = logging.LogRecord("recall_tasks", logging.INFO, __file__, 1, "label %s", (LABEL,), None)
    assert OneLineArgs().filter(record)
    assert record.getMessage() == "label \\x1b]0;pwned\\x07v2"


# ------------------------------------------------------------------------------ through the CLI


def test_the_run_summary_shows_the_label_escaped(out: dict[str, Any]) -> None:
    shown = out["run"].stdout
    assert_inert(shown)
    assert "\\x1b]0;pwned\\x07v2" in shown


@pytest.mark.concurrency  # the CLI in a subprocess on a pseudo-terminal
def test_query_table_on_a_terminal_is_inert(out: dict[str, Any]) -> None:
    sql = "SELECT row_id, category, verdicts[1].statement AS statement FROM results ORDER BY row_id"
    shown = on_terminal("query", sql, "-o", out["output"])
    assert_inert(shown)
    assert "\\x1b[2J" in shown and "q\\x9b2J1" in shown and "\\x1b[31mred\\x1b[0m" in shown
    assert "\\x1b]8;;https://evil.example/" in shown


@pytest.mark.concurrency  # the CLI in a subprocess on a pseudo-terminal
@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_csv_and_markdown_on_a_terminal_are_inert(out: dict[str, Any], fmt: str) -> None:
    sql = "SELECT row_id, category, label FROM results ORDER BY row_id"
    shown = on_terminal("query", sql, "-o", out["output"], "--output-format", fmt, "--limit", "0")
    assert "\x1b" not in shown and "\x9b" not in shown, shown  # no styling either: nothing raw at all
    cell = (lambda v: v.replace("\\", "\\\\")) if fmt == "markdown" else (lambda v: v)  # markdown escapes \\
    assert cell("\\x1b[2J") in shown and cell("\\x1b]0;pwned\\x07v2") in shown and cell("\\x1b[31mred") in shown


@pytest.mark.concurrency  # the CLI in a subprocess on a pseudo-terminal
def test_json_on_a_terminal_escapes_what_json_leaves_raw_and_keeps_the_values(out: dict[str, Any]) -> None:
    sql = "SELECT row_id, label FROM results ORDER BY row_id"
    shown = on_terminal("query", sql, "-o", out["output"], "--output-format", "json", "--limit", "0")
    assert "\x1b" not in shown and "\x9b" not in shown, shown
    assert "\\u009b" in shown
    records = [json.loads(line) for line in shown.splitlines() if line.strip()]
    assert {r["row_id"] for r in records} >= {CLEAR, f"q{C1}1"} and {r["label"] for r in records} == {LABEL}


@pytest.mark.concurrency  # the CLI in a subprocess on a pseudo-terminal
def test_history_on_a_terminal_is_inert(out: dict[str, Any]) -> None:
    shown = on_terminal("history", "-o", out["output"])
    assert_inert(shown)
    assert "\\x1b]0;pwned\\x07v2" in shown


def test_piped_exports_keep_the_exact_bytes(out: dict[str, Any]) -> None:
    sql = "SELECT row_id, category, label, verdicts[1].statement AS statement FROM results ORDER BY row_id"
    runner = CliRunner()  # its stdout is no terminal: a pipe or a file
    as_csv = runner.invoke(app, ["query", sql, "-o", out["output"], "--output-format", "csv", "--limit", "0"])
    assert as_csv.exit_code == 0, as_csv.output
    parsed = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert {r["row_id"] for r in parsed} >= {CLEAR, f"q{C1}1"}
    assert {r["category"] for r in parsed} == {RED, "plain"} and {r["label"] for r in parsed} == {LABEL}
    assert any(r["statement"].startswith(LINK) for r in parsed)
    as_json = runner.invoke(app, ["query", sql, "-o", out["output"], "--output-format", "json", "--limit", "0"])
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["row_id"] for r in records] == [r["row_id"] for r in parsed]
    assert any(r["statement"].startswith(LINK) for r in records)
    history = runner.invoke(app, ["history", "-o", out["output"], "--output-format", "csv"])
    assert LABEL in history.stdout
