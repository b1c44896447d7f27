"""Data in what the CLI prints (issue 58, items 6 and 7).

- csv is opened in spreadsheets: a text cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a CR gets a ``'``
  in front (CWE-1236), numbers stay numbers, ``--raw-cells`` keeps the exact text for programs.
- Nothing is rewritten on the way to the terminal: no emoji codes (``doc:100:7`` was printed ``doc💯7``), no
  markup, no colour codes inside an error line's ids.

The tables come from two real runs (``recall-bench run`` through Prefect, offline judge): a baseline and a
degraded rerun labelled ``+cmd``, so ``comparisons`` holds a negative mean delta.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.cli.output import print_rows, sheet_cell
from tests.test_pipeline import make_rows
from tests.test_tracking import degrade, write

FORMULA = '=HYPERLINK("http://x","y")'
IDS = [FORMULA, "@SUM(1+1)", "-1+2", "-0.25", "[bold]x[/bold]", ":smile:", "doc:100:7"]
NOTES = [FORMULA, "\tx", "plain"]
FIRST_LABEL = ":smile: [bold]v1[/bold]"
ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def out(prefect_harness, tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("cells")
    rows = make_rows(14, seed=3)
    for i, r in enumerate(rows):
        r["note"] = NOTES[i % 3]
        if i < len(IDS):
            r["row_id"] = IDS[i]
    output = str(tmp / "out")
    series = ["--output", output, "--dataset-name", "eval"]
    first = invoke("run", write(tmp / "v1" / "eval.parquet", rows), *series, "--label", FIRST_LABEL)
    assert first.exit_code == 0, first.output
    second = invoke("run", write(tmp / "v2" / "eval.parquet", degrade(rows, 2)), *series, "--label", "+cmd")
    assert second.exit_code == 0, second.output
    return {"output": output, "first": first}


def query_csv(out: dict[str, Any], sql: str, *extra: str) -> list[list[str]]:
    result = invoke("query", sql, "--output", out["output"], "--output-format", "csv", "--limit", "0", *extra)
    assert result.exit_code == 0, result.output
    return list(csv.reader(io.StringIO(result.stdout)))


SQL = (
    "SELECT r.row_id, r.note, r.label, c.mean_delta, r.score - 1 AS delta, 'x' AS \"=1+1\" FROM results r "
    "JOIN comparisons c ON r.run_id = c.current_run_id AND c.segment_column IS NULL ORDER BY r.row_id"
)


def test_csv_text_cells_that_look_like_formulas_get_a_quote_and_numbers_stay(out):
    header, *rows = query_csv(out, SQL)
    assert header == ["row_id", "note", "label", "mean_delta", "delta", "'=1+1"]
    by_id = {r[0]: r for r in rows}
    assert len(rows) == 14 and {r[2] for r in rows} == {"'+cmd"}
    assert set(by_id) >= {"'" + FORMULA, "'@SUM(1+1)", "'-1+2", "-0.25", "[bold]x[/bold]", ":smile:", "doc:100:7"}
    assert {r[1] for r in rows} == {"'" + FORMULA, "'\tx", "plain"}
    deltas = [float(r[4]) for r in rows]
    assert float(rows[0][3]) < 0 and min(deltas) <= -0.25 and all(r[3] == rows[0][3] for r in rows)
    assert all(not r[3].startswith("'") and not r[4].startswith("'") for r in rows)  # numbers untouched

    raw_header, *raw = query_csv(out, SQL, "--raw-cells")
    assert raw_header[-1] == "=1+1"
    assert {r[0] for r in raw} >= set(IDS) and {r[2] for r in raw} == {"+cmd"}
    assert {r[1] for r in raw} == set(NOTES)
    assert [r[3:5] for r in raw] == [r[3:5] for r in rows]  # the same numbers, byte for byte

    history = list(csv.DictReader(io.StringIO(invoke("history", "-o", out["output"], "--output-format", "csv").stdout)))
    raw_history = invoke("history", "-o", out["output"], "--output-format", "csv", "--raw-cells").stdout
    assert [h["label"] for h in history] == [FIRST_LABEL, "'+cmd"]
    assert [h["label"] for h in csv.DictReader(io.StringIO(raw_history))] == [FIRST_LABEL, "+cmd"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_csv_on_a_terminal_is_neutralised_too_and_other_formats_keep_the_text():
    values = [["=1+1", "\r=2", "-0.5", -0.5, "+", "a=b"]]
    term = _Terminal()
    print_rows(["@x", "b", "c", "d", "e", "f"], values, "csv", Console(), file=term)
    assert term.getvalue().splitlines() == ["'@x,b,c,d,e,f", "'=1+1,'\\r=2,-0.5,-0.5,'+,a=b"]
    md = io.StringIO()
    print_rows(["x"], [["=1+1"]], "markdown", Console(), file=md)
    assert md.getvalue().splitlines()[2] == "| =1+1 |"  # no spreadsheet opens Markdown: the text as it is
    assert [sheet_cell(c) for c in ("", "=", "-", "-1", "+1.5e3", "-1e", "@", "x=1")] == [
        "", "'=", "'-", "-1", "+1.5e3", "'-1e", "'@", "x=1",
    ]  # fmt: skip


def test_query_tables_the_run_summary_and_error_lines_print_ids_as_they_are(out):
    table = invoke("query", "SELECT row_id, label FROM results ORDER BY row_id", "--output", out["output"])
    assert table.exit_code == 0, table.output
    for value in ("[bold]x[/bold]", ":smile:", "doc:100:7", FORMULA, FIRST_LABEL):
        assert value in table.stdout, value
    assert FIRST_LABEL in out["first"].stdout  # the run's summary table
    name = "doc:100:7 :smile: [bold]x[/bold]"
    error = invoke("history", "-o", out["output"], "--dataset", name)
    assert error.exit_code == 2
    assert error.stderr.splitlines() == [f"error: no runs of dataset {name!r} recorded under {out['output']}"]
    assert "\U0001f604" not in table.output + out["first"].output + error.output  # 😄


def _duplicates(tmp_path: Path) -> str:
    ids = ["doc:100:7", "[bold]x[/bold]", ":smile:", "doc:100:7", "[bold]x[/bold]", ":smile:"]
    n = len(ids)
    path = tmp_path / "dups.parquet"
    pq.write_table(
        pa.table({"row_id": ids, "input": ["q?"] * n, "expected_output": ["A."] * n, "retrieval_context": [["c"]] * n}),
        path,
    )
    return str(path)


def test_a_duplicate_row_id_is_named_verbatim_in_the_error_line(tmp_path):
    data = _duplicates(tmp_path)
    result = invoke("run", data, "-o", str(tmp_path / "out"), "--judge", "lexical", "--dry-run")
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: row_id must be unique; 3 duplicate(s): 'doc:100:7' (rows 0 and 3 of "), line
    assert "'[bold]x[/bold]' (rows 1 and 4 of " in line and "':smile:' (rows 2 and 5 of " in line


@pytest.mark.concurrency  # a subprocess: the CLI's consoles as a colour terminal makes them
def test_a_coloured_error_line_keeps_its_ids_whole(tmp_path):
    """On a colour terminal (FORCE_COLOR): only ``error:`` is styled, no colour code lands inside an id."""
    data = _duplicates(tmp_path)
    env = {**os.environ, "FORCE_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "300"}
    proc = subprocess.run(
        [sys.executable, "-m", "recall_tasks", "run", data, "-o", str(tmp_path / "out"), "--judge", "lexical",
         "--dry-run"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    styled, _, rest = proc.stderr.partition("\x1b[0m")
    assert styled == "\x1b[1;31merror:" and "\x1b" not in rest, proc.stderr  # the prefix alone is coloured
    assert "3 duplicate(s): 'doc:100:7' (rows 0 and 3 of " in proc.stderr
    assert "'[bold]x[/bold]' (rows 1 and 4 of " in proc.stderr and "':smile:' (rows 2 and 5 of " in proc.stderr
