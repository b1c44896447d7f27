"""The README's promises: its two commands exist and the demo and query it shows work from a fresh folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_first_screen_shows_the_two_commands_and_ci_runs_the_test_one():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t.*recall-bench demo", makefile, re.M)
    assert re.search(r"^test: .*\n\t.*pytest", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_demo_then_readme_query_from_a_fresh_folder(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT)}
    env.pop("OPENAI_API_KEY", None)
    demo = subprocess.run(
        [sys.executable, "-m", "recall_tasks", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "mean_score" in demo.stdout and "HTML report:" in demo.stdout
    ids = {
        line.split('"row_id": "')[1].split('"')[0]
        for line in (ROOT / "recall_tasks" / "data" / "sample.jsonl").read_text().splitlines()
        if line
    }
    assert sum(i in demo.stdout for i in ids) >= 3  # the worst rows are printed
    query = re.search(r'recall-bench query "([^"]+)" --output (\S+)', demo.stdout)
    assert query, demo.stdout
    answer = subprocess.run(
        [sys.executable, "-m", "recall_tasks", "query", query.group(1), "--output", query.group(2)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert answer.returncode == 0, answer.stderr
    assert "row_id" in answer.stdout and "score" in answer.stdout
    assert (tmp_path / "recall-output" / "results" / "_delta_log").is_dir()
    assert list((tmp_path / "recall-output" / "reports").glob("*.html"))
