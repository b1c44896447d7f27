"""The Delta writer's allocator returns freed memory at once in the ``recall-bench`` process
(``cli.app.settle_process``; issue 42 item 3), and a library user's process keeps its own (issue 57 item 7).

deltalake links its own jemalloc, which reads ``_RJEM_MALLOC_CONF`` once, at its first import: the CLI sets it
before any import of deltalake, and a user's own setting is kept. Without it, the pages the commit's Delta write
freed stayed resident ~10 s while the report allocated through Arrow's pool: +130 MiB at the end of a
300,000-row run (docs/performance.md, "1,000,000 rows").
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CLI = (
    "import os\nfrom recall_tasks.cli.app import settle_process\nsettle_process()\nimport deltalake\n"
    "print(os.environ.get('_RJEM_MALLOC_CONF'))"
)
_LIBRARY = "import os, recall_tasks, deltalake\nrecall_tasks.evaluate\nprint(os.environ.get('_RJEM_MALLOC_CONF'))"


def _setting(probe: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


@pytest.mark.concurrency  # subprocesses
def test_the_cli_returns_freed_pages_at_once_unless_the_user_says_otherwise_and_the_library_sets_nothing():
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    assert _setting(_CLI, env) == "dirty_decay_ms:0,muzzy_decay_ms:0"
    assert _setting(_CLI, {**env, "_RJEM_MALLOC_CONF": "narenas:2"}) == "narenas:2"
    assert _setting(_LIBRARY, env) == "None"
