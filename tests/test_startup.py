"""What keeps an ad-hoc run's start-up short, checked structurally (speed itself is in benchmarks/startup.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.prefect_server import REPO, clean_env


@pytest.mark.concurrency
def test_cli_and_server_commands_import_neither_prefect_nor_openai_nor_numpy():
    code = (
        "import sys, recall_tasks.cli.app, recall_tasks.cli.server, recall_tasks\n"
        "heavy = ('prefect', 'openai', 'fastapi', 'duckdb', 'deltalake', 'numpy', 'pyiceberg')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "recall_tasks.LexicalJudge\n"
        "assert 'openai' not in sys.modules\n"
        "recall_tasks.OpenAIJudge\n"
        "assert 'openai' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(REPO)), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
