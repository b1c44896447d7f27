"""The C heap's free pages handed back while a run judges (``recall_tasks/_heap.py``): what a trim releases on
glibc, how often the chunk loop asks for one, one trim at a time across threads, nothing done elsewhere."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from recall_tasks import _heap, evaluate
from recall_tasks.config import RunParams
from recall_tasks.io.blocks import iter_blocks
from recall_tasks.pipeline import steps, workers
from tests.test_pipeline import make_rows, write_parquet

GLIBC = platform.libc_ver()[0] == "glibc"

#: Fragments the heap the way a run does (long-lived allocations between short-lived ones), then reports the
#: resident MiB: at the start, with the freed pages still resident, and after one trim.
FRAGMENT = """
import json
from recall_tasks import _heap

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

base = rss_mib()
blocks = [bytes(1000) + i.to_bytes(4, "little") for i in range(160_000)]  # ~160 MiB of malloc'd objects
kept = blocks[::64]  # one in 64 stays: every 64 KiB of heap keeps a live object
del blocks
freed = rss_mib()
trimmed = _heap.trim_heap()
print(json.dumps({"base": base, "freed": freed, "after": rss_mib(), "trimmed": trimmed, "kept": len(kept)}))
"""


@pytest.fixture
def fresh_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_heap, "_last", -float("inf"))  # no earlier trim of this process counts


def test_glibc_is_found_where_it_is_the_c_library() -> None:
    assert _heap.available() is GLIBC


@pytest.mark.concurrency  # a process of its own: this one's heap is the suite's
def test_a_trim_returns_the_free_pages_between_live_objects() -> None:
    if not GLIBC:  # no /proc either: that trim_heap does nothing there is the test below
        assert _heap.trim_heap() is False
        return
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENT], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1]
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["trimmed"] is True
    held = figures["freed"] - figures["base"]
    assert held > 100, figures  # glibc alone keeps the freed pages resident: the fragmentation a run sees
    assert figures["freed"] - figures["after"] > 0.8 * held, figures  # the trim gives most of them back


def test_the_chunk_loop_asks_at_most_every_few_seconds(fresh_clock: None) -> None:
    if not GLIBC:
        assert _heap.trim_heap() is False
        return
    assert _heap.trim_heap(_heap.TRIM_EVERY_S) is True
    assert _heap.trim_heap(_heap.TRIM_EVERY_S) is False  # within TRIM_EVERY_S of the last one
    assert _heap.trim_heap() is True  # after the commit: whenever the last one was


@pytest.mark.concurrency
def test_threads_asking_at_once_trim_once(fresh_clock: None) -> None:
    start = threading.Barrier(8)
    answers: list[bool] = []

    def ask() -> None:
        start.wait(10)
        answers.append(_heap.trim_heap(3600))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(answers) == [False] * 7 + [GLIBC]


def test_elsewhere_than_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch, fresh_clock: None) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    _heap._malloc_trim.cache_clear()
    try:
        assert _heap.available() is False
        assert _heap.trim_heap() is False
    finally:
        monkeypatch.undo()
        _heap._malloc_trim.cache_clear()
    assert _heap.available() is GLIBC


def count_trims(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[float]:
    asked: list[float] = []
    real = _heap.trim_heap

    def counted(every_s: float = 0.0) -> bool:
        asked.append(every_s)
        return real(every_s)

    monkeypatch.setattr(module, "trim_heap", counted)
    return asked


def test_a_run_asks_after_each_chunk_and_once_after_its_commit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked = count_trims(monkeypatch, _heap)
    result = evaluate(make_rows(12), output=tmp_path / "out", chunk_size=4)
    assert result.results.num_rows == 12
    assert asked == [_heap.TRIM_EVERY_S] * 3 + [0.0]  # three chunks, rate-limited; the commit's, not


def test_a_worker_process_asks_after_its_chunk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "eval.parquet", make_rows(14), row_group_size=7)
    params = RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), chunk_size=7, task_runner="processes")
    plan = steps.plan_run(params)
    asked = count_trims(monkeypatch, _heap)
    try:
        block = next(iter_blocks(plan.dataset, 7))
        assert workers.score_spec(workers.chunk_spec(plan, 0, block, steps.chunk_key(plan, block))).rows == 7
    finally:
        steps.release(plan)
    assert asked == [_heap.TRIM_EVERY_S]
