"""Too few rows for an interval: comparisons and calibrations below ``MIN_INTERVAL_ROWS`` give no interval and no
verdict but ``too_few_rows``, with the reason (docs/regression.md, "Too few rows")."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from recall_tasks.analysis.aggregates import MIN_INTERVAL_ROWS, mean_ci
from recall_tasks.analysis.agreement import PairedRow, agreement, compare
from recall_tasks.analysis.drift import canary_note, judge_drift
from recall_tasks.analysis.regression import compare_runs
from recall_tasks.cli.app import app
from recall_tasks.cli.outcome import verdict_line
from recall_tasks.io.schemas import COMPARISON_SCHEMA
from recall_tasks.reports import alerts
from recall_tasks.reports.comparison import comparison_markdown
from tests.test_drift import canary
from tests.test_regression import ids, planted_drop, results, run_row

Draw = Callable[[np.random.Generator, int], np.ndarray]
DELTAS = np.array([0.0, 0.0, 0.0, 0.0, -1 / 3, 1 / 3, -2 / 3, -1.0])
#: What a night's rows look like to the interval: paired deltas of recall scores, pass/fail, 3-sentence scores.
SHAPES: dict[str, tuple[Draw, float]] = {
    "paired deltas": (lambda rng, n: rng.choice(DELTAS, n), float(DELTAS.mean())),
    "pass/fail at 0.8": (lambda rng, n: rng.binomial(1, 0.8, n).astype(float), 0.8),
    "3-sentence recall": (lambda rng, n: rng.binomial(3, rng.beta(2, 1, n)) / 3, 2 / 3),
}


def coverage(n: int, draw: Draw, truth: float, trials: int = 300) -> float:
    """Share of ``trials`` samples of ``n`` rows whose 95 % bootstrap interval holds the true mean."""
    rng = np.random.default_rng(0)
    hit = 0
    for t in range(trials):
        lo, hi = mean_ci(draw(rng, n), seed=t, resamples=500)
        assert lo is not None and hi is not None
        hit += lo - 1e-12 <= truth <= hi + 1e-12
    return hit / trials


def test_the_minimum_is_where_the_bootstrap_starts_to_cover() -> None:
    """At 10 rows the 95 % percentile bootstrap holds the true mean in ~89-94 % of samples of every shape; at 5 it
    holds it in 2 of 3 for pass/fail rows: an interval there claims a certainty it does not have."""
    assert MIN_INTERVAL_ROWS == 10
    at_min = {name: coverage(MIN_INTERVAL_ROWS, draw, truth) for name, (draw, truth) in SHAPES.items()}
    assert min(at_min.values()) >= 0.85, at_min
    at_half = {name: coverage(MIN_INTERVAL_ROWS // 2, draw, truth) for name, (draw, truth) in SHAPES.items()}
    assert min(at_half.values()) < 0.75, at_half


# ------------------------------------------------------------------------------ comparisons


def test_a_one_row_segment_beside_a_large_one_gets_no_interval_and_no_verdict() -> None:
    cur, base, _ = planted_drop(1000)
    seg = pa.array(["big"] * 1000, pa.string())
    cur, base = cur.append_column("segment", seg), base.append_column("segment", seg)
    tiny_cur = results("cur", ["lonely"], [0.0], segment=["tiny"]).select(cur.column_names)
    tiny_base = results("base", ["lonely"], [1.0], segment=["tiny"]).select(base.column_names)
    cur, base = pa.concat_tables([cur, tiny_cur]), pa.concat_tables([base, tiny_base])
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"), segment_columns=["segment"])
    assert cmp.verdict == "regressed" and cmp.reason is None and cmp.ci_high is not None
    big, tiny = cmp.segments
    assert (big.value, big.verdict, big.reason) == ("big", "regressed", None)
    assert big.ci_low is not None and big.ci_high is not None and big.ci_high < 0
    assert (tiny.value, tiny.n_paired, tiny.mean_delta) == ("tiny", 1, -1.0)
    assert tiny.verdict == "too_few_rows" and (tiny.ci_low, tiny.ci_high) == (None, None)
    assert tiny.reason == "too few rows: 1 paired, an interval needs at least 10"
    rows = pa.Table.from_pylist(cmp.to_rows(), schema=COMPARISON_SCHEMA).to_pylist()
    assert [(r["segment_value"], r["verdict"], r["reason"]) for r in rows] == [
        (None, "regressed", None),
        ("big", "regressed", None),
        ("tiny", "too_few_rows", tiny.reason),
    ]
    assert rows[2]["ci_low"] is None and rows[2]["ci_high"] is None
    row = "| segment | tiny | 1 | 1.0000 | 0.0000 | -1.0000 | [–, –] | 1 / 0 | too_few_rows |"
    assert row in comparison_markdown(cmp)


@pytest.mark.parametrize("n", [1, 2, MIN_INTERVAL_ROWS - 1])
def test_a_comparison_of_too_few_paired_rows_is_too_few_rows(n: int) -> None:
    """Every row fell from 1.0 to 0.0: a one-sided collapse, yet from so few rows neither the mean rule (no
    interval) nor McNemar (p = 2 * 0.5**9 = 0.004 at 9 rows) decides anything."""
    base = results("base", ids(n), [1.0] * n)
    cur = results("cur", ids(n), [0.0] * n)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "too_few_rows" and cmp.like_for_like
    assert cmp.reason == f"too few rows: {n} paired, an interval needs at least 10"
    assert (cmp.ci_low, cmp.ci_high) == (None, None) and cmp.mean_delta == -1.0
    assert cmp.flips_pass_to_fail == n  # the figures are still recorded
    payload = cmp.event_payload()
    assert payload["ci"] == [None, None] and payload["reason"] == cmp.reason
    line = verdict_line(payload, 0.5)
    assert line.startswith(f"vs baseline base: too_few_rows (too few rows: {n} paired, an interval needs at least 10")
    assert "95 % CI" not in line
    assert comparison_markdown(cmp).startswith("## TOO FEW ROWS")
    summary = {"status": "completed", "run_id": "cur", "dataset": "faq"}
    assert alerts.alert_for_run(summary, cmp, None) is None  # no verdict, no alert


def test_at_the_minimum_the_interval_and_the_verdict_are_back() -> None:
    n = MIN_INTERVAL_ROWS
    base = results("base", ids(n), [1.0] * n)
    cur = results("cur", ids(n), [0.0] * n)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "regressed" and cmp.reason is None and (cmp.ci_low, cmp.ci_high) == (-1.0, -1.0)


def test_incomparable_runs_stay_incomparable_whatever_their_size() -> None:
    base = results("base", ids(3), [1.0] * 3)
    cur = results("cur", ids(3), [0.0] * 3)
    cmp = compare_runs(
        cur, base, current_run=run_row("cur", judge_model="gpt-4o"), baseline_run=run_row("base"),
        segment_columns=["run_id"],
    )  # fmt: skip
    assert cmp.verdict == "incomparable" and cmp.reason is not None and "judge_model" in cmp.reason
    assert [(s.verdict, s.reason) for s in cmp.segments] == [("incomparable", None)]


# ------------------------------------------------------------------------------ calibration and canary


def test_agreement_of_one_row_has_figures_but_no_interval() -> None:
    one = agreement([PairedRow([True, False], [True, True], key="r0")])
    assert one.accuracy.value == 0.5 and (one.accuracy.low, one.accuracy.high) == (None, None)
    assert one.accuracy.reason == "too few rows: 1, an interval needs at least 10"
    assert one.tpr.value == 1.0 and one.tpr.low is None
    assert one.kappa.value == 0.0 and one.kappa.low is None
    enough = agreement([PairedRow([True, False], [True, bool(i % 2)], key=f"r{i}") for i in range(10)])
    assert enough.accuracy.low is not None and enough.accuracy.high is not None and enough.accuracy.reason is None
    assert enough.accuracy.low < 0.75 < enough.accuracy.high


def test_a_change_between_few_rows_is_never_a_difference() -> None:
    a = [PairedRow([True] * 5, [True] * 5, key=f"r{i}") for i in range(3)]
    b = [PairedRow([True] * 5, [False] * 5, key=f"r{i}") for i in range(3)]
    d = compare(a, b)
    assert d.delta == -1.0 and (d.low, d.high) == (None, None) and not d.differs
    assert d.reason == "too few rows: 3, an interval needs at least 10"


def test_a_canary_of_too_few_rows_checks_no_drift_and_says_so() -> None:
    small, flipped = canary(rows=5), canary(rows=5, flipped_every=1)
    drift = judge_drift(flipped, small)
    assert drift is not None and not drift.drifted
    note = canary_note(flipped, small)
    assert note == "this run's canary: too few rows: 5, an interval needs at least 10; judge drift not checked"
    assert canary_note(canary(), canary(rows=5)) == (
        "the baseline's canary: too few rows: 5, an interval needs at least 10; judge drift not checked"
    )


def test_calibrate_on_one_row_prints_no_interval_and_records_none(tmp_path: Path) -> None:
    labels = tmp_path / "one.jsonl"
    row = {
        "row_id": "r0", "question": "What about Mars?", "expected_output": "Mars is a planet. Mars has two moons.",
        "contexts": ["Mars is a planet of the Solar System."], "labels": [True, True],
    }  # fmt: skip
    labels.write_text(json.dumps(row) + "\n", encoding="utf-8")
    output = str(tmp_path / "out")
    result = CliRunner().invoke(app, ["calibrate", str(labels), "--judge", "lexical", "-o", output])
    assert result.exit_code == 0, result.output
    assert "0.500 [no interval]" in result.stdout and "[0.500, 0.500]" not in result.stdout
    assert "No intervals: too few rows: 1, an interval needs at least 10." in result.stdout
    sql = "SELECT accuracy, accuracy_low, accuracy_high, undefined FROM calibrations WHERE segment_column IS NULL"
    found = CliRunner().invoke(app, ["query", sql, "--output", output, "--output-format", "json"])
    assert found.exit_code == 0, found.output
    (recorded,) = [json.loads(line) for line in found.stdout.splitlines() if line.strip()]
    assert recorded["accuracy"] == 0.5 and recorded["accuracy_low"] is None and recorded["accuracy_high"] is None
    assert "intervals: too few rows: 1, an interval needs at least 10" in recorded["undefined"]
