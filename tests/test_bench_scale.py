"""benchmarks/scale.py's resident-memory trace: ``_peak_rss.py`` reads the command's RSS as it runs, and the
quarter medians and creep the script prints come from that trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.scale import creep_bytes_per_row, quarter_medians

ROOT = Path(__file__).resolve().parents[1]
# holds 64 MiB for a second, then says whether the tracer's setting reached it
CHILD = "import os, time; b = bytearray(64 * 2**20); time.sleep(1.0); print(os.environ.get('PEAK_RSS_EVERY_S'))"


def peak_rss(tmp_path: Path, every: str | None) -> tuple[dict, str]:
    out = tmp_path / "rss.json"
    env = {"PATH": "/usr/bin:/bin"}
    if every is not None:
        env["PEAK_RSS_EVERY_S"] = every
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "_peak_rss.py"), str(out), sys.executable, "-c", CHILD],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.read_text()), proc.stdout.strip()


@pytest.mark.concurrency
def test_the_trace_follows_the_commands_resident_memory_and_is_not_passed_on(tmp_path):
    found, child_saw = peak_rss(tmp_path, "0.05")
    assert found["exit"] == 0
    trace = found["rss_trace"]
    assert len(trace) >= 5, trace
    assert [t for t, _ in trace] == sorted(t for t, _ in trace)
    assert max(mib for _, mib in trace) >= 64, trace  # the child's buffer, seen while it ran
    assert found["peak_rss_kb"] / 1024 >= 64
    assert child_saw == "None"  # the setting is the tracer's, not the command's


@pytest.mark.concurrency
def test_without_the_setting_there_is_no_trace(tmp_path):
    found, _ = peak_rss(tmp_path, None)
    assert "rss_trace" not in found and found["exit"] == 0


def test_quarter_medians_and_creep_of_a_steady_rise():
    trace = [[float(t), 500.0 + t] for t in range(101)]  # +1 MiB a second
    medians = quarter_medians(trace)
    assert medians == pytest.approx([512.0, 537.0, 562.0, 587.5], abs=0.6)
    # half the rows lie between the second quarter and the last: 50 MiB over 500 rows
    assert creep_bytes_per_row(medians, 1000) == pytest.approx(50.5 * 2**20 / 500, rel=0.02)


def test_a_spike_does_not_move_a_quarters_median_and_short_traces_give_nothing():
    flat = [[float(t), 600.0] for t in range(40)]
    flat[25][1] = 900.0  # a row group's read
    assert quarter_medians(flat) == [600.0] * 4
    assert creep_bytes_per_row(quarter_medians(flat), 100_000) == 0.0
    assert quarter_medians([]) == [] and quarter_medians([[0.0, 100.0]]) == []
    assert creep_bytes_per_row([], 1000) is None
