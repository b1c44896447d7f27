"""The README's promises: its two commands exist, and the demo prints exactly what the quickstart shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")


def test_first_screen_shows_the_two_commands_and_ci_runs_the_test_one():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t.*recall-bench demo", makefile, re.M)
    assert re.search(r"^test: .*\n(\t.*\n)*?\t.*pytest", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_test_runs_every_serial_test(request):
    """The serial step of ``make test`` collects only the files in SERIAL_TESTS: a serial test elsewhere never ran."""
    from tests.conftest import SERIAL_FILES

    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^SERIAL_TESTS\s*:?=(.*)$", makefile, re.M)
    assert listed and re.search(r"^test: .*\n(\t.*\n)*?\t.*pytest -q -m serial \$\(SERIAL_TESTS\)", makefile, re.M)
    collected = request.config.stash[SERIAL_FILES]  # every file collected this session, deselected tests included
    assert collected - set(listed.group(1).split()) == set(), "add these files to SERIAL_TESTS in the Makefile"


@pytest.mark.concurrency
@pytest.mark.parametrize(("fail", "status"), [("", 0), ("not serial", 2), ("-m serial", 2)])
def test_make_test_runs_both_parts_reports_each_and_fails_if_either_failed(tmp_path, fail, status):
    """A failure in the parallel part once stopped make before the serial part ran: a second failure stayed
    hidden until the next CI run. A stand-in python records each part's arguments and fails the one named."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    log = tmp_path / "calls"
    pattern = fail or "never"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *"{pattern}"*) exit 1;; esac\n')
    fake.chmod(0o755)
    done = subprocess.run(
        ["make", "--no-print-directory", "test", f"BIN={fake.parent}", "STAMP=/dev/null"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "not serial" in calls[0] and "-m serial tests/" in calls[1], calls
    assert done.returncode == status, done.stdout + done.stderr
    parallel, serial = (1 if fail == "not serial" else 0), (1 if fail == "-m serial" else 0)
    assert f"make test: parallel part exit {parallel}, serial part exit {serial}" in done.stdout


def quickstart_block() -> list[str]:
    """The README's quickstart output: the lines of the first code block after ``## Quickstart``."""
    section = README.split("## Quickstart", 1)[1]
    return section.split("```\n", 2)[1].rstrip("\n").splitlines()


def masked(lines: list[str]) -> list[str]:
    """Lines with what differs between runs masked: run id, wall_seconds, the folder the demo ran in.

    Everything else (counts, mean, CI, pass rate, the worst rows, the layout) must match exactly.
    """
    out = []
    for line in lines:
        line = RUN_ID.sub("RUN_ID", line.rstrip())
        line = re.sub(r"(│ wall_seconds\s+│ )[0-9.]+\s*│", r"\1WALL│", line)
        line = re.sub(r"^HTML report: .*?(recall-output/reports/)", r"HTML report: DIR/\1", line)
        out.append(line)
    return out


def run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recall_tasks", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.concurrency
def test_demo_prints_what_the_readme_shows_and_its_queries_work(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT)}
    env.pop("OPENAI_API_KEY", None)
    env.pop("RECALL_OUTPUT", None)
    demo = run_cli(["demo"], tmp_path, env)
    assert demo.returncode == 0, demo.stdout + demo.stderr

    block = quickstart_block()
    assert block[0] == "$ make demo"
    makefile = (ROOT / "Makefile").read_text()
    assert block[1] == re.search(r"^demo: .*\n\t(.*)$", makefile, re.M).group(1).replace("$(BIN)", ".venv/bin")
    judge_lines = [line for line in demo.stderr.splitlines() if line.startswith("judge: ")]
    assert (
        judge_lines
        == [block[2]]
        == ["judge: lexical (offline approximation; use --judge openai for numbers you report)"]
    )
    assert masked(demo.stdout.rstrip("\n").splitlines()) == masked(block[3:])

    # the figures the block shows are the run's (runs table), not just its text
    runs = run_cli(
        ["query", "SELECT rows, scored, skipped, mean_score, ci_low, ci_high, pass_rate FROM runs "
         "WHERE segment_column IS NULL", "--output-format", "json"], tmp_path, env,
    )  # fmt: skip
    assert runs.returncode == 0, runs.stderr
    (overall,) = [json.loads(line) for line in runs.stdout.splitlines()]
    shown = {m.group(1): m.group(2) for m in re.finditer(r"│ (\w+)\s+│ (\S+)\s+│", "\n".join(block))}
    for key in ("rows", "scored", "skipped"):
        assert str(overall[key]) == shown[key]
    for key in ("mean_score", "ci_low", "ci_high", "pass_rate"):
        assert f"{overall[key]:.4g}" == shown[key]

    # the query the demo suggests, and the README's example queries, run on the demo's output
    suggested = re.search(r'recall-bench query "([^"]+)" --output (\S+)', demo.stdout)
    assert suggested, demo.stdout
    answer = run_cli(["query", suggested.group(1), "--output", suggested.group(2)], tmp_path, env)
    assert answer.returncode == 0, answer.stderr
    assert "row_id" in answer.stdout and "python-1" in answer.stdout
    examples = re.findall(r'recall-bench query "([^"]+)"', README)
    assert any("FROM runs WHERE segment_column IS NULL" in sql for sql in examples)
    for sql in examples:
        result = run_cli(["query", sql, "--output-format", "json", "--limit", "0"], tmp_path, env)
        assert result.returncode == 0, (sql, result.stderr)
        if "FROM runs" in sql:  # overall rows only: the demo's per-category rows are not mixed in
            assert len(result.stdout.splitlines()) == 1, result.stdout
    assert (tmp_path / "recall-output" / "results" / "_delta_log").is_dir()
    assert list((tmp_path / "recall-output" / "reports").glob("*.html"))


@pytest.mark.concurrency
def test_a_second_demo_into_one_output_lists_its_own_five_least_supported_rows(prefect_harness, tmp_path):
    """The worst-rows table reads this run's rows only: a second demo listed each row twice (both runs')."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    env.pop("RECALL_OUTPUT", None)
    tables = []
    for _ in range(2):
        demo = run_cli(["demo"], tmp_path, env)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        after = demo.stdout.split("The five least supported rows", 1)[1]
        tables.append(re.findall(r"^│ (\S+)\s+│", after, re.M))
    assert tables[1] == tables[0] == ["empty-ctx", "everest-1", "python-1", "tokyo-1", "water-1"], tables


def test_the_readme_is_a_front_door_whose_links_and_figures_hold():
    """At most 250 lines; every local link resolves; every measured figure names its script and its commit."""
    assert len(README.splitlines()) <= 250
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to a missing {target}"
    index = (ROOT / "docs" / "index.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert doc.name == "index.md" or f"({doc.name})" in index, f"docs/index.md does not list {doc.name}"
    measured = README.split("## Measured", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in measured.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert rows
    for row in rows:
        script, commit = re.search(r"`(benchmarks/[\w/]+\.py)`, `([0-9a-f]{7,40})`", row).groups()
        assert (ROOT / script).is_file(), row


def test_docs_index_lists_each_page_once():
    index = (ROOT / "docs" / "index.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        listed = index.count(f"]({doc.name})")
        assert doc.name == "index.md" or listed == 1, f"docs/index.md lists {doc.name} {listed} times, not once"
