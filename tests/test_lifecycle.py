"""A run's one lifecycle (``pipeline/conduct.py``): its inputs checked before its lease is taken, and a lease
another attempt took over stopping the attempt's judge calls at once.

Before, the command line judged ahead of Prefect with a plan of its own: it took the lease before it read the rows,
with no clean-up when the rows failed to decode, so a run refused for a bad data page (text that is not UTF-8)
kept a live lease (the same command from another host was refused for 60 s) and a marker; and a lost lease only
refused the commit, after every row had been paid for.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.io.lease import LeaseLost
from tests.test_caching import ROOT, cli_env
from tests.test_pipeline import make_rows


def parquet(path: Path, rows: list[dict[str, Any]], bad_row: int | None = None) -> str:
    """``rows`` as Parquet; ``bad_row``'s first context holds bytes that are not UTF-8 (a data page Arrow reads
    without complaint: only decoding the text fails)."""
    table = pa.Table.from_pylist(rows)
    if bad_row is not None:
        contexts = [[c.encode() for c in row["contexts"]] for row in rows]
        contexts[bad_row][0] = b"\xff\xfe " + contexts[bad_row][0]
        flat = pa.array([c for cs in contexts for c in cs], pa.binary()).view(pa.string())
        offsets = pa.array([0, *itertools.accumulate(len(cs) for cs in contexts)], pa.int32())
        table = table.set_column(table.schema.get_field_index("contexts"), "contexts",
                                 pa.ListArray.from_arrays(offsets, flat))  # fmt: skip
    pq.write_table(table, path)
    return str(path)


@pytest.mark.concurrency  # real CLI processes on the test's Prefect server
def test_a_run_refused_for_a_bad_data_page_leaves_no_lease_and_the_fixed_data_runs_at_once(
    prefect_harness: None, tmp_path: Path
) -> None:
    rows = make_rows(30, seed=41)
    data = tmp_path / "data" / "eval.parquet"
    data.parent.mkdir()
    parquet(data, rows, bad_row=25)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recall_tasks", "run", str(data), "--output", str(out), "--chunk-size", "10"]
    env = cli_env(None, RECALL_BENCH_LEASE_S="3600")  # a lease left behind would hold for an hour

    refused = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert not list(out.glob("_pending/*.json"))  # no marker, so no lease: refused before it was taken
    assert not (out / "runs").exists()
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "UTF-8 in row 25" in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr

    parquet(data, rows)  # the data fixed: the same command runs at once
    fixed = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "completed" in fixed.stdout and "run in progress" not in fixed.stderr
    assert not list(out.glob("_pending/*.json"))  # committed: the marker went


def test_a_lost_lease_stops_the_attempts_judge_calls_at_once(
    fake_openai: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another attempt takes the run over while this one judges (its lease rewritten by another host): the next
    renewal finds it, the judge calls stop within a round of the concurrency and the run ends with LeaseLost,
    nothing committed. Before, the attempt judged every row it had left and was refused only at its commit."""
    from recall_tasks import evaluate
    from tests import judge_script
    from tests.test_pipeline import KEY

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("RECALL_BENCH_LEASE_S", "1.5")  # renewed every 0.5 s
    fake_openai.set_responder(judge_script.responder)
    fake_openai.latency_s = 0.2
    rows = make_rows(300, seed=42)  # ~8 s of judging at concurrency 8
    out = tmp_path / "out"
    concurrency = 8
    taken_at: list[float] = []

    def take_over() -> None:
        assert fake_openai.wait_for_requests(20, timeout=120)
        (marker,) = out.glob("_pending/*.json")
        record = json.loads(marker.read_text())
        now = time.time()
        record["lease"] = {
            **record["lease"], "host": f"not-{socket.gethostname()}", "pid": os.getpid() + 1, "node": "",
            "attempt": "another-attempt", "renewed": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now)),
        }  # fmt: skip
        marker.write_text(json.dumps(record))
        taken_at.append(time.monotonic())

    thief = threading.Thread(target=take_over, daemon=True)
    thief.start()
    with pytest.raises(LeaseLost) as lost:
        evaluate(rows, output=out, judge="openai", base_url=fake_openai.base_url, chunk_size=50,
                 max_concurrency=concurrency)  # fmt: skip
    thief.join(10)
    assert taken_at
    sent = len(fake_openai.chat_requests)
    after = fake_openai.chat_requests_since(taken_at[0] + 1.0)  # a renewal (0.5 s) and the cancel: then no more
    assert after <= 2 * concurrency, (after, sent)
    assert sent < len(rows) / 2, sent
    assert not (out / "runs").exists()
    time.sleep(0.5)
    assert len(fake_openai.chat_requests) == sent  # nothing sent once the run ended
    assert "took it over" in str(lost.value) and "stopped judging" in str(lost.value)
