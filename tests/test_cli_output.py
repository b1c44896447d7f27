"""The CLI's output for people and scripts (issue 11), its read-only query and markup-safe printing (issue 16).

Every test reads tables written by real runs (`recall-bench run` through Prefect, offline judge) in one output:
a baseline run and a degraded rerun of the same dataset, so `results`, `runs` and `comparisons` all exist.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.main import get_command
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from tests.test_pipeline import make_rows
from tests.test_tracking import degrade, write

SECRET = "sk-test-output-secret-0123456789"
LABEL = "idx [/] [bold]v2[/bold]"
ROOT = Path(__file__).resolve().parents[1]
LEXICAL_LINE = "judge: lexical (offline approximation; use --judge openai for numbers you report)"


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def one_error_line(result, starts: str) -> None:
    """Exit 2, and the only output is one ``error: …`` line starting with ``starts`` (no traceback)."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), result.stderr
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def out(prefect_harness, tmp_path_factory) -> dict:
    """Two real runs of one dataset into one delta output: a baseline and a degraded rerun with a markup label."""
    tmp = tmp_path_factory.mktemp("cli-output")
    rows = make_rows(60, seed=3)
    for i, r in enumerate(rows):
        r["note"] = ["arr[i] + b[j]", "[/]", "[bold]x[/bold]"][i % 3]
    base = write(tmp / "v1" / "eval.parquet", rows)
    worse = write(tmp / "v2" / "eval.parquet", degrade(rows, 2))
    output = str(tmp / "out")
    series = ["--dataset-name", "eval"]  # two index versions' files, one series
    first = invoke("run", base, "--output", output, "--label", "prod", *series)
    assert first.exit_code == 0, first.output
    second = invoke("run", worse, "--output", output, "--label", LABEL, *series)
    assert second.exit_code == 0, second.output
    from deltalake import DeltaTable

    runs = DeltaTable(os.path.join(output, "runs")).to_pyarrow_table().to_pylist()
    overall = sorted((r for r in runs if r["segment_column"] is None), key=lambda r: r["started_at"])
    return {"output": output, "first": first, "second": second, "run_ids": [r["run_id"] for r in overall]}


# -- A: formats, limits, history, defaults ------------------------------------------------------------------------


def test_query_json_lines_csv_markdown_and_piped_table(out):
    sql = "SELECT run_id, row_id, score, verdicts FROM results ORDER BY run_id, row_id"
    as_json = invoke("query", sql, "--output", out["output"], "--output-format", "json", "--limit", "0")
    assert as_json.exit_code == 0, as_json.output
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(records) == 120 and set(records[0]) == {"run_id", "row_id", "score", "verdicts"}
    assert {r["run_id"] for r in records} == set(out["run_ids"])
    assert all(isinstance(r["verdicts"], list) and "statement" in r["verdicts"][0] for r in records)

    as_csv = invoke("query", sql, "--output", out["output"], "--output-format", "csv", "--limit", "0")
    parsed = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert len(parsed) == 120 and parsed[0]["row_id"] == records[0]["row_id"]
    assert json.loads(parsed[0]["verdicts"]) == records[0]["verdicts"]

    as_md = invoke("query", sql, "--output", out["output"], "--output-format", "markdown", "--limit", "3")
    lines = as_md.stdout.splitlines()
    assert lines[:2] == ["| run_id | row_id | score | verdicts |", "|---|---|---|---|"] and len(lines) == 5

    # piped (CliRunner's stdout is no terminal): full values, one row per line, whatever COLUMNS says
    table = invoke("query", sql, "--output", out["output"], "--limit", "4", env={"COLUMNS": "40"})
    assert "…" not in table.stdout
    assert sum(records[i]["run_id"] in table.stdout for i in range(4)) == 4
    assert records[0]["verdicts"][0]["statement"] in table.stdout


def test_a_cut_listing_says_so_on_stderr_and_limit_zero_prints_all(out):
    cut = invoke("query", "SELECT row_id FROM results", "--output", out["output"], "--output-format", "csv")
    assert cut.exit_code == 0
    assert len(cut.stdout.splitlines()) == 1 + 50
    assert cut.stderr.strip() == "50 of 120 rows shown; --limit 0 for all"
    whole = invoke("query", "SELECT row_id FROM results", "--output", out["output"], "--output-format", "csv",
                   "--limit", "0")  # fmt: skip
    assert len(whole.stdout.splitlines()) == 1 + 120 and whole.stderr == ""
    exact = invoke("query", "SELECT row_id FROM results LIMIT 7", "--output", out["output"], "--limit", "7")
    assert exact.stderr == ""


def test_history_prints_full_run_ids_the_judge_and_verdicts(out):
    first, second = out["run_ids"]
    table = invoke("history", "--output", out["output"], env={"COLUMNS": "60"})
    assert table.exit_code == 0, table.output
    assert first in table.stdout and second in table.stdout and "lexical" in table.stdout
    assert "first of series" in table.stdout and f"regressed vs {first}" in table.stdout
    assert LABEL in table.stdout  # markup in a label printed as is

    lines = invoke("history", "--output", out["output"], "--output-format", "json").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["run_id"] for r in records] == [first, second]
    assert [r["judge"] for r in records] == ["lexical", "lexical"]
    assert records[1]["verdict"] == "regressed" and records[1]["baseline_run_id"] == first
    assert records[0]["verdict"] is None and records[1]["label"] == LABEL
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", records[0]["started_at"])
    assert 0 <= records[1]["mean_score"] < records[0]["mean_score"] <= 1

    latest = invoke("history", "--output", out["output"], "--limit", "1", "--output-format", "csv")
    assert [r["run_id"] for r in csv.DictReader(io.StringIO(latest.stdout))] == [second]
    assert latest.stderr.strip() == "1 of 2 rows shown; --limit 0 for all"

    only = invoke("history", "--output", out["output"], "--dataset", "eval", "--output-format", "json")
    assert len(only.stdout.splitlines()) == 2
    one_error_line(
        invoke("history", "--output", out["output"], "--dataset", "nope"),
        f"error: no runs of dataset 'nope' recorded under {out['output']}",
    )

    md = invoke("history", "--output", out["output"], "--output-format", "markdown").stdout.splitlines()
    assert md[0].startswith("| started | dataset | label | run_id | status | judge |") and len(md) == 4


def test_run_prints_the_judge_first_and_accepts_markup_in_labels(out):
    second = out["second"]
    assert second.stderr.splitlines()[0] == LEXICAL_LINE
    assert LABEL in second.stdout  # the run summary, after the commit: no MarkupError
    # the threshold a pass needs is shown beside the pass rate and the flips
    assert re.search(r"│ threshold\s+│ 0\.5\s+│", second.stdout), second.stdout
    assert re.search(r"\d+ pass->fail / \d+ fail->pass at threshold 0\.5, 60 paired\)", second.stdout), second.stdout
    assert "open it locally" not in second.stdout  # a local report opens as it is


def test_openai_judge_line_names_model_and_host_only():
    from recall_tasks.cli.output import judge_line

    line = judge_line("openai", "gpt-4o-mini", "http://user:pw@127.0.0.1:8089/v1")
    assert line == "judge: openai gpt-4o-mini at 127.0.0.1:8089"
    assert judge_line("openai", "m", None) == "judge: openai m at api.openai.com"


def test_version_and_every_option_has_help():
    from importlib.metadata import version

    shown = invoke("--version")
    assert shown.exit_code == 0 and shown.stdout.strip() == f"recall-bench {version('recall-bench')}"
    group = get_command(app)
    missing = [
        f"{name} {param.opts[0]}"
        for name, command in group.commands.items()  # type: ignore[attr-defined]
        for param in command.params
        if param.param_type_name == "option" and not getattr(param, "help", None) and param.name != "help"
    ]
    assert missing == []
    assert all(getattr(p, "help", None) for p in group.params if p.name != "help")


def test_parquet_output_detected_env_default_output_missing_tables_and_incomparable(prefect_harness, tmp_path):
    data = write(tmp_path / "eval.parquet", make_rows(8, seed=5))
    output = str(tmp_path / "pq-out")
    env = {"RECALL_OUTPUT": output}
    empty = invoke("history", env=env)
    one_error_line(empty, f"error: no runs recorded under {output}")

    ran = invoke("run", data, "--format", "parquet", "--chunk-size", "4", env=env)  # no -o: RECALL_OUTPUT
    assert ran.exit_code == 0, ran.output
    assert (Path(output) / "runs").is_dir() and not (Path(output) / "runs" / "_delta_log").exists()

    listed = invoke("history", "--output-format", "json", env=env)  # no --format: parquet detected
    assert listed.exit_code == 0, listed.output
    (run,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert run["rows"] == 8 and run["judge"] == "lexical"

    missing = invoke("query", "SELECT verdict FROM comparisons", env=env)
    one_error_line(
        missing,
        f"error: no table 'comparisons' under {output} yet: it is written when a run is compared with a baseline",
    )

    again = invoke("run", data, "--chunk-size", "4", env=env)  # no --format: appends to the parquet tables there
    assert again.exit_code == 0, again.output
    assert list(Path(output).rglob("_delta_log")) == []
    counted = invoke("query", "SELECT count(DISTINCT run_id) AS runs, count(*) AS n FROM results", "--output-format",
                     "json", env=env)  # fmt: skip
    assert json.loads(counted.stdout) == {"runs": 2, "n": 16}  # parquet datasets scan with external access off
    first, second = [
        json.loads(line) for line in invoke("history", "--output-format", "json", env=env).stdout.splitlines()
    ]
    assert first["run_id"] == run["run_id"] and second["baseline_run_id"] == run["run_id"] and second["verdict"]

    # the comparison rewritten as incomparable, with its reason (nullable `reason` column)
    (path,) = (Path(output) / "comparisons").rglob("*.parquet")
    table = pq.read_table(path, partitioning=None)
    overall = [c["segment_column"] is None for c in table.to_pylist()]
    verdicts = pa.array(["incomparable" if o else "unchanged" for o in overall])
    table = table.set_column(table.column_names.index("verdict"), "verdict", verdicts)
    reason = pa.array(["judge differs (gpt-4o vs lexical)" if o else None for o in overall], pa.string())
    if "reason" in table.column_names:
        table = table.set_column(table.column_names.index("reason"), "reason", reason)
    else:
        table = table.append_column("reason", reason)
    pq.write_table(table, path)
    shown = invoke("history", env=env)
    assert f"incomparable vs {run['run_id']}: judge differs (gpt-4o vs lexical)" in shown.stdout
    records = [json.loads(line) for line in invoke("history", "--output-format", "json", env=env).stdout.splitlines()]
    assert records[1]["verdict"] == "incomparable" and records[1]["reason"] == "judge differs (gpt-4o vs lexical)"


def test_history_tolerates_comparisons_without_a_reason_column():
    from recall_tasks.cli.output import history_cells, history_records

    started = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.UTC)
    run = {
        "run_id": "b",
        "started_at": started,
        "dataset": "eval",
        "label": None,
        "judge_model": "lexical",
        "rows": 3,
        "mean_score": 0.5,
        "ci_low": 0.4,
        "ci_high": 0.6,
        "pass_rate": 1.0,
        "segment_column": None,
    }
    comparison = {"current_run_id": "b", "baseline_run_id": "a", "segment_column": None, "verdict": "unchanged"}
    (record,) = history_records(pa.Table.from_pylist([run]), pa.Table.from_pylist([comparison]))
    assert record["reason"] is None and history_cells(record)[-1] == "unchanged vs a"


def test_query_reads_delta_tables_on_s3_with_external_access_off(prefect_harness, s3_server, s3_bucket, monkeypatch,
                                                                 tmp_path):  # fmt: skip
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    data = write(tmp_path / "eval.parquet", make_rows(6, seed=4))
    output = f"s3://{s3_bucket}/recall"
    ran = invoke("run", data, "--output", output)
    assert ran.exit_code == 0, ran.output
    (run_id,) = re.findall(r"│ run_id\s+│ (\S+)\s+│", ran.stdout)
    assert f"HTML report: {output}/reports/{run_id}.html" in ran.stdout
    hint = f"open it locally: recall-bench report {run_id} --output {output} --to ."
    assert hint in ran.stdout  # a browser cannot open s3://
    local = invoke("report", run_id, "--output", output, "--to", str(tmp_path))
    assert local.exit_code == 0 and (tmp_path / f"{run_id}.html").is_file(), local.output
    joined = invoke("query", "SELECT count(*) AS n, max(r.rows) AS rows FROM results JOIN runs r USING (run_id) "
                    "WHERE r.segment_column IS NULL", "--output", output, "--output-format", "json")  # fmt: skip
    assert joined.exit_code == 0, joined.output
    assert json.loads(joined.stdout) == {"n": 6, "rows": 6}
    refused = invoke("query", f"SELECT * FROM read_parquet('{output}/results/*/*/*.parquet')", "--output", output)
    one_error_line(refused, "error: query refused")


def test_an_openai_run_names_model_and_host_first(prefect_harness, fake_openai, monkeypatch, tmp_path):
    from tests import judge_script

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    fake_openai.set_responder(judge_script.responder)
    data = write(tmp_path / "eval.parquet", make_rows(4, seed=2))
    ran = invoke(
        "run", data, "--output", str(tmp_path / "out"), "--judge", "openai", "--base-url", fake_openai.base_url
    )
    assert ran.exit_code == 0, ran.output
    host = fake_openai.base_url.split("//", 1)[1].split("/", 1)[0]
    assert ran.stderr.splitlines()[0] == f"judge: openai gpt-4o-mini at {host}"
    assert SECRET not in ran.output


def test_report_to_a_local_path(out, tmp_path):
    run_id = out["run_ids"][1]
    target = tmp_path / "reports" / "r.html"
    written = invoke("report", run_id, "--output", out["output"], "--to", str(target))
    assert written.exit_code == 0, written.output
    assert written.stdout.strip() == str(target) and run_id in target.read_text()
    into_folder = invoke("report", run_id, "--output", out["output"], "--to", str(tmp_path))
    assert (tmp_path / f"{run_id}.html").is_file() and into_folder.exit_code == 0
    unknown = invoke("report", "nope", "--output", out["output"], "--to", str(tmp_path))
    one_error_line(unknown, "error: run nope not found")
    latest = invoke("report", "latest", "--output", out["output"], "--to", str(tmp_path / "latest.html"))
    assert latest.exit_code == 0 and run_id in (tmp_path / "latest.html").read_text(), latest.output  # the later run
    empty = str(tmp_path / "empty")
    one_error_line(invoke("report", "latest", "--output", empty), f"error: no runs recorded under {empty}")


def test_bad_option_values_are_one_error_line(out):
    one_error_line(
        invoke("query", "SELECT 1", "--output", out["output"], "--output-format", "xml"),
        "error: --output-format must be one of table, csv, json, markdown, got 'xml'",
    )
    one_error_line(invoke("history", "--output", out["output"], "--format", "orc"), "error: --format must be delta")
    one_error_line(invoke("query", "SELEC 1", "--output", out["output"]), "error: query failed: Parser Error")


# -- B: the read-only query -------------------------------------------------------------------------------------


def _json(out, sql: str) -> list[dict]:
    result = invoke("query", sql, "--output", out["output"], "--output-format", "json", "--limit", "0")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_analysts_sql_keeps_working_with_external_access_off(out):
    from deltalake import DeltaTable

    results = DeltaTable(os.path.join(out["output"], "results")).to_pyarrow_table().to_pylist()
    first, second = out["run_ids"]
    joined = _json(out, "SELECT r.label, count(*) AS n FROM results s JOIN runs r USING (run_id) "
                        "WHERE r.segment_column IS NULL GROUP BY r.label ORDER BY r.label")  # fmt: skip
    assert joined == [{"label": LABEL, "n": 60}, {"label": "prod", "n": 60}]
    statements = _json(out, "SELECT count(*) AS n, count(*) FILTER (WHERE v.verdict = 'yes') AS yes "
                            "FROM results, unnest(verdicts) AS t(v)")  # fmt: skip
    assert statements[0]["n"] == sum(len(r["verdicts"]) for r in results)
    assert statements[0]["yes"] == sum(v["verdict"] == "yes" for r in results for v in r["verdicts"])
    ranked = _json(out, "SELECT run_id, row_id, row_number() OVER (PARTITION BY run_id ORDER BY score, row_id) AS k "
                        "FROM results QUALIFY k = 1 ORDER BY run_id")  # fmt: skip
    assert [r["run_id"] for r in ranked] == sorted([first, second])
    cte = _json(out, "WITH o AS (SELECT run_id, mean_score FROM runs WHERE segment_column IS NULL), "
                     "c AS (SELECT current_run_id, verdict FROM comparisons WHERE segment_column IS NULL) "
                     "SELECT o.run_id, c.verdict, o.mean_score - avg(s.score) AS diff FROM o "
                     "JOIN results s USING (run_id) LEFT JOIN c ON c.current_run_id = o.run_id "
                     "GROUP BY o.run_id, c.verdict, o.mean_score ORDER BY o.run_id")  # fmt: skip
    # run ids of the same second are ordered by their random suffix, not by time
    assert [(r["run_id"], r["verdict"]) for r in cte] == sorted([(first, None), (second, "regressed")])
    assert all(abs(r["diff"]) < 1e-9 for r in cte)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_text('/proc/self/environ')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM glob('/*')",
        "COPY (SELECT 1) TO '{tmp}/copied.csv'",
        "ATTACH '{tmp}/attached.db'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
    ],
)
def test_dangerous_sql_is_refused(out, tmp_path, monkeypatch, sql):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    result = invoke("query", sql.format(tmp=tmp_path), "--output", out["output"])
    one_error_line(result, "error: query refused: it reads only the tables results, runs, comparisons and calibrations")
    assert SECRET not in result.output and list(tmp_path.iterdir()) == []


def test_copy_into_the_delta_log_is_refused_and_later_commands_work(out):
    log = Path(out["output"]) / "runs" / "_delta_log"
    before = sorted(p.name for p in log.iterdir())
    target = log / "00000000000000000099.json"
    refused = invoke("query", f"COPY (SELECT 'x' AS y) TO '{target}' (FORMAT json)", "--output", out["output"])
    one_error_line(refused, "error: query refused")
    assert sorted(p.name for p in log.iterdir()) == before
    assert _json(out, "SELECT count(*) AS n FROM runs WHERE segment_column IS NULL") == [{"n": 2}]
    assert invoke("history", "--output", out["output"]).exit_code == 0


def test_printed_values_are_redacted_in_every_format(out, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    sql = f"SELECT 'key={SECRET}' AS leaked, ['{SECRET}'] AS listed, {{'k': '{SECRET}'}} AS nested"
    for fmt in ("table", "csv", "json", "markdown"):
        result = invoke("query", sql, "--output", out["output"], "--output-format", fmt)
        assert result.exit_code == 0, result.output
        assert SECRET not in result.output and "key=***" in result.stdout, fmt


# -- C: data is never markup --------------------------------------------------------------------------------------


def test_query_prints_brackets_and_markup_as_is(out):
    result = invoke(
        "query",
        "SELECT DISTINCT note, 'arr[i] + b[j]' AS \"[red]col[/]\" FROM results ORDER BY note",
        "--output",
        out["output"],
    )
    assert result.exit_code == 0, result.output
    for value in ("arr[i] + b[j]", "[/]", "[bold]x[/bold]", "[red]col[/]"):
        assert value in result.stdout


def test_markdown_and_csv_keep_cells_whole():
    from recall_tasks.cli.output import print_rows

    value = "a|b\n<img src=x onerror=alert(1)>, [/]"
    md, sheet = io.StringIO(), io.StringIO()
    print_rows(["x"], [[value]], "markdown", Console(), file=md)
    assert md.getvalue().splitlines()[2] == "| a\\|b<br>&lt;img src=x onerror=alert(1)&gt;, [/] |"
    print_rows(["x"], [[value]], "csv", Console(), file=sheet)
    assert list(csv.reader(io.StringIO(sheet.getvalue()))) == [["x"], [value]]


def test_terminal_tables_fold_values_and_keep_run_ids_whole():
    from recall_tasks.cli.output import print_rows

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=50, color_system=None)
    run_id = "20261201T082751Z-cd99a1"
    long = "x" * 120
    print_rows(["run_id", "value"], [[run_id, long], ["[/]", "arr[i] + b[j]"]], "table", console, keep_whole=["run_id"])
    shown = buffer.getvalue()
    assert run_id in shown and "…" not in shown and "arr[i] + b[j]" in shown and "[/]" in shown
    assert shown.count("x") == 120  # folded over lines, not cut
    assert max(len(line) for line in shown.splitlines()) <= 50


@pytest.mark.concurrency
def test_history_fits_an_80_column_terminal_and_shows_the_threshold(out):
    """A real terminal of 80 columns: columns dropped (not folded into 3-character pieces), the threshold shown."""
    first, second = out["run_ids"]
    env = {**os.environ, "COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-m", "recall_tasks", "history", "--output", out["output"]],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in shown.stdout.splitlines()]  # the header's bold
    assert lines and max(len(line) for line in lines) <= 80, shown.stdout
    header = [c.strip() for c in re.split(r"[│┃]", next(line for line in lines if "run_id" in line))[1:-1]]
    assert {"run_id", "mean", "pass rate", "verdict"} <= set(header) and "judge" not in header
    widths = [len(c) for c in re.split(r"[│┃]", next(line for line in lines if "run_id" in line))[1:-1]]
    assert min(widths) > 5, lines  # no column squeezed to a few characters
    rows = [dict(zip(header, [c.strip() for c in re.split(r"[│┃]", line)[1:-1]], strict=True))
            for line in lines if first in line or second in line]  # fmt: skip
    assert [r["run_id"] for r in rows] == [first, second]
    assert [r["verdict"] for r in rows] == ["first", "regressed"]
    assert all(re.fullmatch(r"\d+\.\d% ≥0\.5", r["pass rate"]) for r in rows), rows
    assert all(re.fullmatch(r"0\.\d{3}", r["mean"]) for r in rows), rows
    # the long label may continue on a second line; every other cell of a row is on the run id's line
    assert len(lines) <= 4 + 2 * 2, lines


def test_query_tables_round_floats_for_display_only(out):
    sql = "SELECT 2 / 3.0::DOUBLE AS share, 1 / 7000.0::DOUBLE AS tiny, 5.0::DOUBLE AS whole"
    table = invoke("query", sql, "--output", out["output"])
    assert table.exit_code == 0, table.output
    assert "0.6667" in table.stdout and "0.000143" in table.stdout and "0.6666666" not in table.stdout, table.stdout
    md = invoke("query", sql, "--output", out["output"], "--output-format", "markdown")
    assert "| 0.6667 | 0.000143 | 5.0 |" in md.stdout, md.stdout
    as_csv = invoke("query", sql, "--output", out["output"], "--output-format", "csv")
    assert str(2 / 3) in as_csv.stdout and str(1 / 7000) in as_csv.stdout, as_csv.stdout
    as_json = invoke("query", sql, "--output", out["output"], "--output-format", "json")
    assert json.loads(as_json.stdout)["share"] == 2 / 3


def test_history_shortens_a_long_incomparable_reason_and_json_keeps_it(out):
    from recall_tasks.cli.output import history_cells

    fields = ("judge", "prompt_version", "units")
    reasons = [f"{f} differs (current '{'x' * 30}', baseline '{'y' * 30}')" for f in fields]
    rec = {"verdict": "incomparable", "baseline_run_id": "20261204T000000Z-abcdef", "reason": "; ".join(reasons),
           "ci_low": None, "started_at": None, "dataset": "d", "label": None, "run_id": "r", "status": "completed",
           "judge": "j", "rows": 1, "mean_score": 0.5, "pass_rate": 0.5, "threshold": 0.5}  # fmt: skip
    cell = history_cells(rec)[-1]
    assert len(cell) <= 140 and cell.startswith("incomparable vs 20261204T000000Z-abcdef: judge differs"), cell
    assert "--output-format json" in cell, cell
    full = invoke("history", "--output", out["output"], "--output-format", "json")
    assert full.exit_code == 0 and all("reason" in json.loads(line) for line in full.stdout.splitlines())
