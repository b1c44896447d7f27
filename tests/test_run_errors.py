"""What ``recall-bench run`` prints, in real processes: its own lines only, one line per error, ``--debug`` for more.

(The judge line every run prints first is set aside: tests/test_cli_output.py covers it.)

Subprocesses, not CliRunner: Prefect's console handler writes to the process's real stderr, which an
in-process runner would not capture (a test of "no Prefect lines" could then never fail).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_openai import Status
from tests.prefect_server import free_port
from tests.test_caching import ROOT, cli_env, write
from tests.test_pipeline import KEY, make_rows

PREFECT_LOG_LINE = re.compile(r"\| (DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|")


def run_cli(judge, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recall_tasks", "run", *args], env=cli_env(judge, **env), cwd=ROOT,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The output's lines after the judge line every run starts with."""
    found = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return [line for line in found if not line.startswith("judge: ")]


@pytest.fixture
def data(tmp_path: Path) -> str:
    return write(tmp_path / "eval.parquet", make_rows(12, seed=3))


@pytest.mark.concurrency
def test_a_run_prints_no_prefect_internals(prefect_harness, fake_openai, data, tmp_path):
    done = run_cli(fake_openai, data, "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mean_score" in done.stdout
    text = done.stdout + done.stderr
    assert not PREFECT_LOG_LINE.search(text), text
    assert "Finished in state" not in text and "Traceback" not in text


@pytest.mark.concurrency
def test_no_cache_prints_no_prefect_cache_warning_even_with_debug(prefect_harness, fake_openai, data, tmp_path):
    args = (data, "--output", str(tmp_path / "out"), "--no-cache", "--debug")
    done = run_cli(fake_openai, *args, PREFECT_LOGGING_LEVEL="INFO")
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert "Finished in state Completed" in text  # --debug shows Prefect's logs: the warning would be seen
    assert "cache_policy" not in text and "cache_key_fn" not in text, text


@pytest.mark.concurrency
def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(prefect_harness, fake_openai, data, tmp_path):
    args = (data, "--output", str(tmp_path / "out"), "--retriever", "tests.sample_retriever:crashes")
    done = run_cli(fake_openai, *args)
    assert done.returncode == 2
    assert lines(done) == ["error: RuntimeError: index service unavailable (rerun with --debug for the traceback)"], (
        done.stdout + done.stderr
    )

    debug = run_cli(fake_openai, *args, "--debug")
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr and "sample_retriever.py" in debug.stderr
    assert lines(debug)[-1] == "error: RuntimeError: index service unavailable"


@pytest.mark.concurrency
def test_a_rejected_key_names_the_variable_to_set_not_a_missing_option(prefect_harness, fake_openai, data, tmp_path):
    fake_openai.enqueue(*[Status(401, code="invalid_api_key")] * 50)
    done = run_cli(fake_openai, data, "--output", str(tmp_path / "out"), "--judge", "openai", "--base-url",
                   fake_openai.base_url)  # fmt: skip
    assert done.returncode == 2
    (line,) = lines(done)
    assert line.startswith("error: ") and "rejected the API key (401): set OPENAI_API_KEY" in line, line
    assert "--api-key" not in line and KEY not in line


@pytest.mark.concurrency
def test_an_unreachable_prefect_api_url_is_one_line(fake_openai, data, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/api"
    done = run_cli(fake_openai, data, "--output", str(tmp_path / "out"), PREFECT_API_URL=url)
    assert done.returncode == 2
    (line,) = lines(done)
    assert line.startswith(f"error: the Prefect API at {url} (PREFECT_API_URL) cannot be reached"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["run", "d.parquet", "--concurrency", "3"],
         "error: No such option: --concurrency (Possible options: --max-concurrency); see recall-bench run --help"),
        (["run"], "error: Missing argument 'dataset_uri'; see recall-bench run --help"),
        (["histroy"], "error: No such command 'histroy'. Did you mean 'history'? See recall-bench --help"),
    ],
)  # fmt: skip
@pytest.mark.concurrency
def test_a_usage_error_is_one_line_naming_the_help_and_exits_2(args, line):
    """A mistyped option or command is one `error:` line like every other error, not a usage block and a panel."""
    done = subprocess.run([sys.executable, "-m", "recall_tasks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**cli_env(None), "COLUMNS": "80"})  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [line] and done.stdout == ""


@pytest.mark.concurrency
def test_recall_bench_alone_still_prints_the_help():
    done = subprocess.run([sys.executable, "-m", "recall_tasks"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=cli_env(None))  # fmt: skip
    assert done.returncode == 2 and "Usage: recall-bench [OPTIONS] COMMAND" in done.stderr + done.stdout
    assert "error:" not in done.stderr
