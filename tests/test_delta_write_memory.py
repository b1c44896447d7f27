"""The commit's Delta write of ``results`` holds a bounded amount of memory, whatever the run's size.

deltalake's partitioned write takes batches from the run's reader while other tasks of its tokio runtime encode
them; with a worker thread per core, a reader faster than the encoding queued the difference, and a
1,000,000-row commit held +730 MiB on 2 cores. The ``recall-bench`` process gives that runtime one worker
(``TOKIO_WORKER_THREADS``, unless the user set it: ``cli.app.settle_process``; the library sets nothing): the same
write holds ~+200 MiB at any size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_WRITE = r"""
import json, sys, threading, time
from recall_tasks.cli.app import settle_process
settle_process()  # what the recall-bench process sets before deltalake starts its runtime
import pyarrow as pa
from recall_tasks.io.delta import DeltaBackend
from recall_tasks.io.storage import StorageConfig

rows, out = int(sys.argv[1]), sys.argv[2]
n = 20_000
words = [f"w{i:05d}" for i in range(4000)]
block = pa.table({
    "run_id": ["r1"] * n, "row_id": [f"q{i:07d}" for i in range(n)],
    "reason": [" ".join(words[(i * 7 + j * 13) % 4000] for j in range(40)) for i in range(n)],
    "verdicts": [" ".join(words[(i * 11 + j * 17) % 4000] for j in range(120)) for i in range(n)],
    "score": [1.0] * n, "dataset": ["d"] * n, "run_date": ["2026-12-05"] * n,
})

def batches():
    for start in range(0, rows, n):  # slices of one table: a reader much faster than any encoder
        yield from block.slice(0, min(n, rows - start)).to_batches(max_chunksize=2000)

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024

peak = [0]
def poll():
    while True:
        peak[0] = max(peak[0], rss())
        time.sleep(0.01)

threading.Thread(target=poll, daemon=True).start()
time.sleep(0.05)
before = peak[0] = rss()
DeltaBackend(out, StorageConfig.from_options()).append(
    "results", lambda: pa.RecordBatchReader.from_batches(block.schema, batches()), commit_id="c1",
    key=("run_id", "r1"), partition={"dataset": "d", "run_date": "2026-12-05"},
)
print(json.dumps({"growth": peak[0] - before, "block_bytes": block.nbytes}))
"""


@pytest.mark.concurrency  # a subprocess: the runtime's workers are set before deltalake starts it
def test_a_large_results_commit_holds_a_bounded_amount_of_memory(tmp_path):
    """600,000 rows (~700 MB of Arrow through the writer): the write's peak above where it started stays under
    300 MiB (~+110 with one worker; with two workers it grew with the rows: ~+590 on 2 cores)."""
    proc = subprocess.run([sys.executable, "-c", _WRITE, "600000", str(tmp_path / "out" / "results")], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["growth"] < 300 * 2**20, result
