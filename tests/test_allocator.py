"""The Delta writer's allocator returns freed memory at once (``recall_tasks/__init__.py``; issue 42 item 3).

deltalake links its own jemalloc, which reads ``_RJEM_MALLOC_CONF`` once, at its first import: the package sets it
before any import of deltalake, and a user's own setting is kept. Without it, the pages the commit's Delta write
freed stayed resident ~10 s while the report allocated through Arrow's pool: +130 MiB at the end of a
300,000-row run (docs/performance.md, "1,000,000 rows").
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = "import os, recall_tasks, deltalake; print(os.environ.get('_RJEM_MALLOC_CONF'))"


def _setting(env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


@pytest.mark.concurrency  # subprocesses
def test_freed_pages_are_returned_at_once_unless_the_user_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    assert _setting(env) == "dirty_decay_ms:0,muzzy_decay_ms:0"
    assert _setting({**env, "_RJEM_MALLOC_CONF": "narenas:2"}) == "narenas:2"
