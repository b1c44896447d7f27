"""Judge drift from two runs' canaries (analysis/drift.py) and what the comparison and its alert make of it."""

from __future__ import annotations

from typing import Any

import pytest

from recall_tasks.analysis.comparability import incomparable_reasons
from recall_tasks.analysis.drift import canary_note, judge_drift
from recall_tasks.analysis.regression import compare_runs
from recall_tasks.io.schemas import COMPARISON_SCHEMA
from recall_tasks.reports import alerts
from tests.test_regression import mixed_scores, planted_drop, results, run_row


def canary(rows: int = 40, *, flipped_every: int = 0, canary_id: str = "sha256:c1", **kw: Any) -> dict[str, Any]:
    """A run row's canary columns: ``rows`` rows of 5 units (3 labelled supported); every ``flipped_every``-th
    row has one supported unit judged unsupported (0: the judge agrees on every unit)."""
    detail = []
    for i in range(rows):
        miss = 1 if flipped_every and i % flipped_every == 0 else 0
        detail.append({"key": f"c{i}", "tp": 3 - miss, "fn": miss, "fp": 0, "tn": 2})
    units = 5 * rows
    wrong = sum(d["fn"] for d in detail)
    return {
        "canary_id": canary_id, "canary_rows": rows, "canary_units": units, "canary_detail": detail,
        "canary_accuracy": 1 - wrong / units if units else None, "canary_accuracy_low": None,
        "canary_accuracy_high": None, **kw,
    }  # fmt: skip


def test_a_judge_that_agrees_less_on_the_same_canary_drifted() -> None:
    drift = judge_drift(canary(flipped_every=1), canary())
    assert drift is not None and drift.drifted and drift.paired and drift.paired_rows == 40
    accuracy = next(m for m in drift.figures if m.name == "accuracy")
    assert (accuracy.baseline, accuracy.current) == (1.0, pytest.approx(0.8))
    assert accuracy.delta == pytest.approx(-0.2) and accuracy.high is not None and accuracy.high < 0
    reason = drift.reason()
    assert reason.startswith("judge drift: canary accuracy 1.000 -> 0.800") and "40 paired canary rows" in reason


def test_the_same_answers_or_a_change_within_the_interval_is_no_drift() -> None:
    same = judge_drift(canary(), canary())
    assert same is not None and not same.drifted
    one_row = judge_drift(canary(flipped_every=40), canary())  # 1 unit of 200 on 1 row of 40: within chance
    assert one_row is not None and not one_row.drifted


def test_drift_is_checked_only_on_the_same_labelled_set() -> None:
    assert judge_drift(canary(canary_id="sha256:a", flipped_every=1), canary(canary_id="sha256:b")) is None
    assert "different labelled sets" in (canary_note(canary(canary_id="sha256:a"), canary(canary_id="sha256:b")) or "")
    assert canary_note(canary(), {}) == "the baseline run has no canary: judge drift not checked"
    assert "this run has no canary" in (canary_note({}, canary()) or "")
    assert canary_note({}, {}) is None and canary_note(canary(), canary()) is None
    unjudged = canary(rows=0, canary_errors=40, canary_accuracy=None)  # e.g. the budget ran out before it
    assert (
        canary_note(unjudged, canary())
        == "this run's canary got no verdict (40 rows without one): judge drift not checked"
    )
    drift = judge_drift(unjudged, canary())
    assert drift is not None and not drift.drifted


def test_runs_recorded_without_per_row_counts_fall_back_to_non_overlapping_intervals() -> None:
    def stored(value: float, low: float, high: float) -> dict[str, Any]:
        return {"canary_id": "sha256:c1", "canary_accuracy": value, "canary_accuracy_low": low,
                "canary_accuracy_high": high}  # fmt: skip

    apart = judge_drift(stored(0.80, 0.75, 0.85), stored(0.95, 0.92, 0.98))
    assert apart is not None and apart.drifted and not apart.paired and "do not overlap" in apart.reason()
    overlapping = judge_drift(stored(0.90, 0.85, 0.95), stored(0.93, 0.90, 0.96))
    assert overlapping is not None and not overlapping.drifted


def test_a_drifted_judge_makes_a_score_change_incomparable_never_regressed() -> None:
    cur, base, _ = planted_drop()
    plain = compare_runs(cur, base, current_run=run_row("cur", **canary()), baseline_run=run_row("base", **canary()))
    assert plain.verdict == "regressed" and not plain.judge_drift  # the same judge: the drop is the retriever's
    assert plain.canary is not None and plain.canary["drifted"] is False
    drifted = compare_runs(
        cur, base, current_run=run_row("cur", **canary(flipped_every=1)), baseline_run=run_row("base", **canary())
    )
    assert drifted.verdict == "incomparable" and drifted.judge_drift and not drifted.like_for_like
    assert drifted.reason is not None and drifted.reason.startswith("judge drift: canary accuracy 1.000 -> 0.800")
    assert drifted.mean_delta == pytest.approx(-0.1)  # the figures are still computed, for inspection
    rows = drifted.to_rows()
    assert [r["judge_drift"] for r in rows] == [True] and list(rows[0]) == COMPARISON_SCHEMA.names
    payload = drifted.event_payload()
    assert payload["judge_drift"] is True and payload["canary"]["current"]["accuracy"][0] == pytest.approx(0.8)
    assert payload["canary"]["baseline"]["accuracy"][0] == 1.0


def test_an_improvement_under_a_drifted_judge_is_incomparable_too() -> None:
    cur, base, _ = planted_drop()
    drifted = compare_runs(
        base, cur, current_run=run_row("cur", **canary(flipped_every=1)), baseline_run=run_row("base", **canary())
    )
    assert drifted.verdict == "incomparable" and drifted.judge_drift


def test_a_canary_on_one_side_only_keeps_todays_verdict_and_says_so() -> None:
    cur, base, _ = planted_drop()
    only_current = compare_runs(cur, base, current_run=run_row("cur", **canary()), baseline_run=run_row("base"))
    assert only_current.verdict == "regressed" and not only_current.judge_drift and only_current.canary is None
    assert "the baseline run has no canary: judge drift not checked" in only_current.warnings
    neither = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert neither.warnings == [] and neither.verdict == "regressed"


def test_a_changed_judge_model_is_named_not_also_drift() -> None:
    reasons = incomparable_reasons(
        run_row("cur", judge_model="gpt-4o", **canary(flipped_every=1)), run_row("base", **canary())
    )
    assert len(reasons) == 1 and reasons[0].startswith("judge_model differs")


def test_the_baseline_selection_prefers_a_run_whose_judge_agreed_alike() -> None:
    import pyarrow as pa

    from recall_tasks.analysis.baseline import find_baseline
    from recall_tasks.io.schemas import RUN_SCHEMA

    base = {"dataset": "faq", "metric": "contextual_recall", "status": "completed", "segment_column": None}
    runs = [
        {**base, "run_id": "n1", "finished_at": None, "started_at": None, **canary()},
        {**base, "run_id": "n2", "finished_at": None, "started_at": None, **canary(flipped_every=1)},
    ]
    table = pa.Table.from_pylist(runs, schema=RUN_SCHEMA)
    tonight = {**base, "run_id": "n3", **canary()}  # the judge answers as on n1 again
    found = find_baseline(table, dataset="faq", metric="contextual_recall", exclude_run_id="n3", current=tonight)
    assert found is not None and found["run_id"] == "n1"


def test_the_alert_of_a_drifted_comparison_says_judge_drift_with_the_figures() -> None:
    ids = [f"r{i}" for i in range(20)]
    scores = mixed_scores(20)
    comparison = compare_runs(
        results("cur", ids, scores), results("base", ids, scores), resamples=200,
        current_run=run_row("cur", **canary(flipped_every=1)), baseline_run=run_row("base", **canary()),
    )  # fmt: skip
    summary = {"run_id": "cur", "dataset": "faq", "label": "nightly", "status": "completed", "status_reason": None,
               "mean_score": 0.5, "ci_low": 0.4, "ci_high": 0.6}  # fmt: skip
    alert = alerts.alert_for_run(summary, comparison, None)
    assert alert is not None and alert.name == "recall.comparison.incomparable"
    assert alert.payload["judge_drift"] is True
    subject, message = alert.payload["subject"], alert.payload["message"]
    assert subject.startswith("recall run not comparable with its baseline (judge drift): faq"), subject
    assert "Judge drift: the judge's agreement with the canary's labels (40 rows, 200 units) moved" in message
    assert "- accuracy: baseline 1.000" in message and "this run 0.800" in message, message
    assert "beyond its interval" in message
