"""Known-answer tests of the regression module: pairing, statistics, verdicts, baseline selection, outputs."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from recall_tasks.analysis.baseline import find_baseline
from recall_tasks.analysis.comparability import incomparable_reasons
from recall_tasks.analysis.regression import compare_runs
from recall_tasks.analysis.statistics import (
    MCNEMAR_EXACT_MAX,
    _binomial_tail_exact,
    _binomial_tail_log,
    mcnemar_exact_p,
    paired_mean_ci,
)
from recall_tasks.analysis.worst_rows import lost_statements
from recall_tasks.errors import ConfigError
from recall_tasks.io.results import RUN_SCHEMA
from recall_tasks.io.schemas import COMPARISON_SCHEMA, VERDICT_TYPE
from recall_tasks.reports.comparison import comparison_markdown

THRESHOLD = 0.5


def verdicts_for(row: int, score: float, n: int = 4) -> list[dict[str, Any]]:
    """n statements for a row, the first round(score * n) judged yes."""
    yes = round(score * n)
    return [
        {"statement": f"row{row} s{j}", "verdict": "yes" if j < yes else "no", "reason": "", "chunk_ids": []}
        for j in range(n)
    ]


def results(
    run_id: str,
    row_ids: list[str],
    scores: list[float | None],
    *,
    success: list[bool | None] | None = None,
    verdicts: list[list[dict[str, Any]]] | None = None,
    segment: list[str | None] | None = None,
) -> pa.Table:
    """A results table of one run (the columns compare_runs reads)."""
    if success is None:
        success = [None if s is None else s >= THRESHOLD for s in scores]
    if verdicts is None:
        verdicts = [[] if s is None else verdicts_for(i, s) for i, s in enumerate(scores)]
    cols: dict[str, Any] = {
        "run_id": pa.array([run_id] * len(row_ids), pa.string()),
        "row_id": pa.array(row_ids, pa.string()),
        "score": pa.array(scores, pa.float64()),
        "success": pa.array(success, pa.bool_()),
        "verdicts": pa.array(verdicts, pa.list_(VERDICT_TYPE)),
        "error": pa.array(["JudgeResponseError: bad" if s is None else None for s in scores], pa.string()),
    }
    if segment is not None:
        cols["segment"] = pa.array(segment, pa.string())
    return pa.table(cols)


def run_row(run_id: str, **kw: Any) -> dict[str, Any]:
    row = {
        "run_id": run_id,
        "dataset": "faq",
        "metric": "contextual_recall",
        "judge_model": "gpt-4o-mini",
        "prompt_version": "v3",
        "threshold": THRESHOLD,
    }
    row.update(kw)
    return row


MIXED = [0.0, 0.25, 0.5, 0.75, 1.0]


def mixed_scores(n: int) -> list[float]:
    return [MIXED[i % len(MIXED)] for i in range(n)]


def ids(n: int, prefix: str = "r") -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(n)]


def planted_drop(n: int = 1000, dropped: int = 100) -> tuple[pa.Table, pa.Table, list[str]]:
    """Baseline: `dropped` rows at 1.0 (all yes), the rest mixed; current: those rows at 0.0 (fail)."""
    row_ids = ids(n)
    base_scores = mixed_scores(n)
    planted = list(range(3, n, n // dropped))[:dropped]
    for i in planted:
        base_scores[i] = 1.0
    cur_scores = list(base_scores)
    cur_verdicts = [verdicts_for(i, s) for i, s in enumerate(base_scores)]
    for i in planted:
        cur_scores[i] = 0.0
        # s0 and s2 now "no", s1 and s3 missing from the judge's output: all four lost
        cur_verdicts[i] = [
            {"statement": f"row{i} s0", "verdict": "no", "reason": "", "chunk_ids": []},
            {"statement": f"row{i} s2", "verdict": "no", "reason": "", "chunk_ids": []},
        ]
    base = results("base", row_ids, list(base_scores))
    cur = results("cur", row_ids, list(cur_scores), verdicts=cur_verdicts)
    return cur, base, [row_ids[i] for i in planted]


# -- McNemar ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (3, 0, 0.25),
        (0, 3, 0.25),
        (5, 1, 0.21875),
        (1, 5, 0.21875),
        (0, 0, 1.0),
        (4, 4, 1.0),
        (10, 0, 2 * 0.5**10),
        (6, 2, 0.2890625),  # 2 * (1 + 8 + 28) / 256
        (100, 0, 2 * 0.5**100),
    ],
)
def test_mcnemar_exact_hand_computed(b: int, c: int, expected: float) -> None:
    assert mcnemar_exact_p(b, c) == pytest.approx(expected, rel=1e-12, abs=0)


def test_mcnemar_exact_matches_math_comb() -> None:
    for b, c in [(7, 2), (20, 9), (41, 60), (150, 120)]:
        n, m = b + c, min(b, c)
        expected = min(1.0, 2 * sum(math.comb(n, k) for k in range(m + 1)) / 2**n)
        assert mcnemar_exact_p(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_log_space_agrees_with_exact() -> None:
    for n, m in [(1000, 430), (15_000, 7_300), (20_000, 9_800), (5_000, 3)]:
        assert _binomial_tail_log(n, m) == pytest.approx(_binomial_tail_exact(n, m), rel=1e-8)
    # past the exact limit the log path is used and stays sensible
    n = MCNEMAR_EXACT_MAX + 1000
    p = mcnemar_exact_p(n // 2 + 50, n - (n // 2 + 50))
    assert 0.4 < p < 0.6
    assert mcnemar_exact_p(600_000, 400_000) == 0.0  # underflows: far beyond any alpha
    with pytest.raises(ValueError, match="discordant counts must be >= 0"):
        mcnemar_exact_p(-1, 2)


# -- interval ---------------------------------------------------------------------------------------


def test_paired_ci_methods() -> None:
    assert paired_mean_ci(np.array([])) == (None, None)
    assert paired_mean_ci(np.zeros(500)) == (0.0, 0.0)
    assert paired_mean_ci(np.array([0.3])) == (0.3, 0.3)
    rng = np.random.default_rng(1)
    d = rng.normal(-0.05, 0.2, size=5_000)
    lo, hi = paired_mean_ci(d, seed=3)
    assert lo is not None and hi is not None
    assert lo < d.mean() < hi
    half = 1.96 * d.std(ddof=1) / math.sqrt(len(d))
    assert hi - lo == pytest.approx(2 * half, rel=0.1)  # bootstrap ≈ normal at this n
    assert paired_mean_ci(d, seed=3) == (lo, hi)  # seeded: reproducible
    big = rng.normal(0.01, 0.3, size=50_000)  # normal approximation
    lo, hi = paired_mean_ci(big)
    half = 1.959963984540054 * big.std(ddof=1) / math.sqrt(len(big))
    assert (lo, hi) == pytest.approx((big.mean() - half, big.mean() + half), rel=1e-12)


# -- verdicts ---------------------------------------------------------------------------------------


def test_identical_runs_unchanged() -> None:
    scores = mixed_scores(500)
    base = results("base", ids(500), list(scores))
    cur = results("cur", ids(500), list(scores))
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "unchanged"
    assert cmp.n_paired == 500 and cmp.n_added == 0 and cmp.n_removed == 0 and cmp.n_unpaired_unscored == 0
    assert cmp.mean_delta == 0.0
    assert cmp.mean_current == cmp.mean_baseline == pytest.approx(0.5)
    assert (cmp.ci_low, cmp.ci_high) == (0.0, 0.0)
    assert cmp.flips_pass_to_fail == 0 and cmp.flips_fail_to_pass == 0
    assert cmp.mcnemar_p == 1.0
    assert cmp.worst_rows == []
    assert cmp.like_for_like is True and cmp.warnings == []


def test_planted_drop_regressed() -> None:
    cur, base, planted = planted_drop()
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "regressed"
    assert cmp.n_paired == 1000
    assert cmp.mean_delta == -0.1
    assert cmp.ci_low is not None and cmp.ci_high is not None
    assert cmp.ci_low < -0.1 < cmp.ci_high < 0
    assert cmp.flips_pass_to_fail == 100 and cmp.flips_fail_to_pass == 0
    assert cmp.mcnemar_p < 1e-10
    assert cmp.mcnemar_p == pytest.approx(2 * 0.5**100)
    assert len(cmp.worst_rows) == 10
    planted_set = set(planted)
    for w in cmp.worst_rows:
        assert w.row_id in planted_set
        assert (w.score_baseline, w.score_current, w.delta) == (1.0, 0.0, -1.0)
        i = int(w.row_id[1:])
        assert w.lost == [f"row{i} s0", f"row{i} s1", f"row{i} s2", f"row{i} s3"]
    # ties broken by table order: the first ten planted rows
    assert [w.row_id for w in cmp.worst_rows] == planted[:10]


def test_symmetric_improvement() -> None:
    cur, base, _ = planted_drop()
    cmp = compare_runs(base, cur, current_run=run_row("base"), baseline_run=run_row("cur"))
    assert cmp.verdict == "improved"
    assert cmp.mean_delta == 0.1
    assert cmp.ci_low is not None and cmp.ci_low > 0
    assert cmp.flips_pass_to_fail == 0 and cmp.flips_fail_to_pass == 100
    assert cmp.mcnemar_p < 1e-10
    assert cmp.worst_rows == []  # nothing dropped


def test_noise_within_tolerance_unchanged() -> None:
    rng = np.random.default_rng(7)
    n = 2000
    base_scores = np.where(rng.random(n) < 0.5, rng.uniform(0.1, 0.4, n), rng.uniform(0.6, 0.95, n))
    cur_scores = base_scores + rng.uniform(-0.01, 0.01, n)
    base = results("base", ids(n), base_scores.tolist())
    cur = results("cur", ids(n), cur_scores.tolist())
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "unchanged"
    assert cmp.mean_delta is not None and abs(cmp.mean_delta) < 0.001
    assert cmp.flips_pass_to_fail == cmp.flips_fail_to_pass == 0
    assert cmp.mcnemar_p == 1.0


def test_small_drop_with_consistent_flips_regressed_by_mcnemar() -> None:
    # 1 % of rows drop 1.0 → 0.0: mean −0.01 is inside the 0.02 tolerance, but 10 flips one way and none back
    # are significant (p = 2 · 0.5¹⁰): the flips rule reports a regression on purpose.
    cur, base, _ = planted_drop(n=1000, dropped=10)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"), tolerance=0.02)
    assert cmp.mean_delta == -0.01
    assert cmp.mean_delta > -cmp.tolerance
    assert cmp.flips_pass_to_fail == 10 and cmp.flips_fail_to_pass == 0
    assert cmp.mcnemar_p == pytest.approx(0.001953125, rel=1e-12)
    assert cmp.verdict == "regressed"
    # with a stricter alpha the flips are not enough and the mean change is within tolerance
    strict = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"), alpha=0.001)
    assert strict.verdict == "unchanged"


def test_mean_drop_without_flips_regressed() -> None:
    # every row loses 0.05 but nobody crosses the threshold: the mean rule alone fires
    n = 400
    base_scores = [0.9 if i % 2 else 0.3 for i in range(n)]
    cur_scores = [s - 0.05 for s in base_scores]
    base = results("base", ids(n), base_scores)
    cur = results("cur", ids(n), cur_scores)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.flips_pass_to_fail == 0 and cmp.mcnemar_p == 1.0
    assert cmp.mean_delta == pytest.approx(-0.05)
    assert cmp.ci_high is not None and cmp.ci_high < 0
    assert cmp.verdict == "regressed"
    assert len(cmp.worst_rows) == 10


# -- pairing ----------------------------------------------------------------------------------------


def test_added_removed_and_unscored_rows_are_counted_not_paired() -> None:
    base_ids = ids(100) + ["gone1", "gone2", "gone3"]
    cur_ids = ids(100) + ["new1", "new2", "new3", "new4", "new5"]
    base_scores: list[float | None] = [0.5] * 103
    cur_scores: list[float | None] = [0.5] * 105
    cur_scores[10] = None  # errored in the current run
    cur_scores[11] = None
    base_scores[12] = None  # errored in the baseline
    base_scores[13] = None  # unscored in both
    cur_scores[13] = None
    # the unpaired rows carry extreme scores: if they leaked into the pairing the means would move
    base_scores[100:] = [0.0, 0.0, 0.0]
    cur_scores[100:] = [1.0] * 5
    base = results("base", base_ids, base_scores)
    cur = results("cur", cur_ids, cur_scores)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.n_added == 5
    assert cmp.n_removed == 3
    assert cmp.n_unpaired_unscored == 4
    assert cmp.n_paired == 96
    assert cmp.mean_current == cmp.mean_baseline == 0.5 and cmp.mean_delta == 0.0
    assert cmp.verdict == "unchanged"


def test_pairing_ignores_row_order_and_duplicates_warn() -> None:
    n = 200
    scores = mixed_scores(n)
    base = results("base", ids(n), scores)
    perm = np.random.default_rng(0).permutation(n)
    cur = results("cur", [ids(n)[i] for i in perm], [scores[i] for i in perm])
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.n_paired == n and cmp.mean_delta == 0.0 and cmp.verdict == "unchanged"

    dup = pa.concat_tables([cur, cur.slice(0, 5)])
    cmp = compare_runs(dup, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.n_paired == n and cmp.n_added == 0
    assert any("repeat 5 row id" in w for w in cmp.warnings)


def test_disjoint_rows_are_incomparable_with_the_counts() -> None:
    base = results("base", ids(10, "a"), [0.5] * 10)
    cur = results("cur", ids(10, "b"), [0.5] * 10)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "incomparable" and cmp.like_for_like is False
    assert cmp.reason is not None and "only 0 of the baseline's 10 rows (0%)" in cmp.reason
    assert cmp.n_paired == 0 and cmp.n_added == 10 and cmp.n_removed == 10
    assert cmp.mean_delta is None and cmp.ci_low is None and cmp.mcnemar_p == 1.0


def test_no_row_scored_in_both_runs_is_no_overlap() -> None:
    base = results("base", ids(10), [0.5] * 10)
    cur = results("cur", ids(10), [None] * 10)
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "no_overlap" and cmp.reason is None
    assert cmp.n_paired == 0 and cmp.n_unpaired_unscored == 10
    assert any("no row was scored in both" in w for w in cmp.warnings)


def test_pairing_below_90_percent_of_the_baseline_is_incomparable() -> None:
    cur, base, _ = planted_drop(100)
    kept = cur.slice(0, 89)  # 89 of the baseline's 100 rows pair
    cmp = compare_runs(kept, base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert cmp.verdict == "incomparable"
    assert "only 89 of the baseline's 100 rows (89%)" in (cmp.reason or "")
    assert all(s.verdict == "incomparable" for s in cmp.segments)
    ninety = compare_runs(cur.slice(0, 90), base, current_run=run_row("cur"), baseline_run=run_row("base"))
    assert ninety.verdict == "regressed" and ninety.reason is None


# -- like for like ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("judge_model", "gpt-4.1"),
        ("prompt_version", "v4"),
        ("threshold", 0.7),
        ("scale", 100.0),
        ("metric", "context_coverage"),
        ("judge", "lexical"),
        ("units", "claims"),
        ("splitter_version", "sentences-v2"),
        ("schema_version", "verdicts-v2"),
        ("judge_config", "other-fingerprint"),
        ("row_identity", "row_id column"),
    ],
)
def test_a_different_setting_makes_the_verdict_incomparable(field: str, value: Any) -> None:
    cur, base, _ = planted_drop()
    v2 = {"judge": "openai", "units": "sentences", "splitter_version": "sentences-v1", "schema_version": "verdicts-v1",
          "judge_config": "fp", "row_identity": "input+expected_output/v2", "scale": 1.0}  # fmt: skip
    cmp = compare_runs(
        cur, base, current_run=run_row("cur", **{**v2, field: value}), baseline_run=run_row("base", **v2)
    )
    assert cmp.verdict == "incomparable" and cmp.like_for_like is False  # never regressed, though it dropped
    assert cmp.reason is not None and f"{field} differs" in cmp.reason and repr(value) in cmp.reason
    payload = cmp.event_payload()
    assert payload["verdict"] == "incomparable" and payload["reason"] == cmp.reason
    assert "**Incomparable**" in comparison_markdown(cmp)
    assert cmp.to_rows()[0]["reason"] == cmp.reason and cmp.to_rows()[0]["verdict"] == "incomparable"
    same = compare_runs(cur, base, current_run=run_row("cur", **v2), baseline_run=run_row("base", **v2))
    assert same.verdict == "regressed" and same.reason is None


def test_a_baseline_recorded_before_row_identity_v2_is_incomparable() -> None:
    cur, base, _ = planted_drop()
    new = run_row("cur", row_identity="input+expected_output/v2", judge="openai")
    old = run_row("base")  # written by an older version: no row_identity, no judge field
    cmp = compare_runs(cur, base, current_run=new, baseline_run=old)
    assert cmp.verdict == "incomparable" and "before row identity v2" in (cmp.reason or "")
    # with a row_id column the ids never depended on the contents: the old baseline still pairs
    with_ids = compare_runs(cur, base, current_run={**new, "row_identity": "row_id column"}, baseline_run=old)
    assert with_ids.verdict == "regressed"


def test_incomparable_reasons_ignore_fields_an_old_baseline_lacks() -> None:
    old = run_row("base")
    assert (
        incomparable_reasons(run_row("cur", judge="openai", units="sentences", row_identity="row_id column"), old) == []
    )
    assert incomparable_reasons(run_row("cur", dataset="other"), old) == [
        "dataset differs (current 'other', baseline 'faq')"
    ]


def test_a_different_dataset_uri_is_a_warning() -> None:
    cur, base, _ = planted_drop()
    cmp = compare_runs(
        cur, base, current_run=run_row("cur", dataset_uri="s3://a/eval.parquet"),
        baseline_run=run_row("base", dataset_uri="s3://b/eval.parquet"),
    )  # fmt: skip
    assert cmp.verdict == "regressed"
    assert any("dataset URI differs" in w and "s3://b/eval.parquet" in w for w in cmp.warnings)


def test_a_different_dataset_uri_is_no_warning_in_a_named_series() -> None:
    """``--dataset-name`` says the location moves (dated folders): the URI differing is expected, not a warning."""
    cur, base, _ = planted_drop()
    cmp = compare_runs(
        cur, base, current_run=run_row("cur", dataset_uri="s3://a/2026-11-30/", dataset_id="name:golden"),
        baseline_run=run_row("base", dataset_uri="s3://a/2026-11-29/", dataset_id="name:golden"),
    )  # fmt: skip
    assert not any("dataset URI differs" in w for w in cmp.warnings), cmp.warnings


# -- lost statements --------------------------------------------------------------------------------


def test_lost_statements_matched_by_text() -> None:
    def v(statement: str, verdict: str) -> dict[str, Any]:
        return {"statement": statement, "verdict": verdict}

    base = [v("A", "yes"), v("B", "yes"), v("C", "no"), v("D", "yes"), v("A", "yes")]
    cur = [v("D", "yes"), v("A", "no"), v("C", "yes")]  # order changed, B absent
    assert lost_statements(base, cur) == ["A", "B"]
    assert lost_statements(base, None) == ["A", "B", "D"]
    assert lost_statements(None, cur) == []


# -- baseline selection -----------------------------------------------------------------------------


def _t(hour: int) -> dt.datetime:
    return dt.datetime(2024, 6, 1, hour, tzinfo=dt.UTC)


def runs_table() -> pa.Table:
    def row(run_id: str, hour: int, **kw: Any) -> dict[str, Any]:
        base = {
            "run_id": run_id,
            "dataset": "faq",
            "metric": "contextual_recall",
            "label": "nightly",
            "status": "completed",
            "started_at": _t(hour) - dt.timedelta(minutes=5),
            "finished_at": _t(hour),
            "segment_column": None,
            "segment_value": None,
            "mean_score": 0.8,
        }
        base.update(kw)
        return base

    rows = [
        row("r1", 1, label="prod"),
        row("r2", 2),
        row("r2", 2, segment_column="segment", segment_value="a"),
        row("r3", 3, label="prod"),
        row("r4", 4, status="failed"),
        row("r5", 5, dataset="other"),
        row("r6", 6, metric="context_coverage"),
        row("r7", 7, label="prod"),  # the current run
    ]
    return pa.Table.from_pylist(rows, schema=RUN_SCHEMA)


def test_find_baseline_latest() -> None:
    runs = runs_table()
    found = find_baseline(runs, dataset="faq", metric="contextual_recall", exclude_run_id="r7")
    assert found is not None
    assert found["run_id"] == "r3"  # r4 failed, r5/r6 other series, r7 excluded
    assert found["segment_column"] is None
    found = find_baseline(runs, dataset="faq", metric="contextual_recall")
    assert found is not None and found["run_id"] == "r7"
    assert find_baseline(runs, dataset="new", metric="contextual_recall") is None
    # a run without finished_at sorts after every finished one
    unfinished = runs.set_column(
        runs.schema.get_field_index("finished_at"),
        "finished_at",
        pa.array(
            [
                None if r == "r7" else t
                for r, t in zip(runs["run_id"].to_pylist(), runs["finished_at"].to_pylist(), strict=True)
            ],
            runs.schema.field("finished_at").type,
        ),
    )
    found = find_baseline(unfinished, dataset="faq", metric="contextual_recall")
    assert found is not None and found["run_id"] == "r3"


def test_find_baseline_label_and_run_id() -> None:
    runs = runs_table()
    found = find_baseline(runs, dataset="faq", metric="contextual_recall", spec="label:prod", exclude_run_id="r7")
    assert found is not None and found["run_id"] == "r3"
    found = find_baseline(runs, dataset="faq", metric="contextual_recall", spec="label:nightly")
    assert found is not None and found["run_id"] == "r2" and found["segment_column"] is None
    for spec in ("run:r1", "r1", " run:r1 "):
        found = find_baseline(runs, dataset="faq", metric="contextual_recall", spec=spec, exclude_run_id="r7")
        assert found is not None and found["run_id"] == "r1"
    # an explicit run is returned even when its series differs (compare_runs flags the mismatch), never a failed one
    with pytest.raises(ConfigError, match="status 'failed': a failed or unfinished run is never a baseline"):
        find_baseline(runs, dataset="faq", metric="contextual_recall", spec="run:r4")
    found = find_baseline(runs, dataset="faq", metric="contextual_recall", spec="r5")
    assert found is not None and found["dataset"] == "other"


def test_find_baseline_prefers_the_latest_comparable_run() -> None:
    runs = runs_table()
    lexical = {"run_id": "r8", "dataset": "faq", "metric": "contextual_recall", "judge_model": "lexical"}
    mixed = pa.Table.from_pylist(
        [{**r, "judge_model": "lexical" if r["run_id"] == "r3" else "gpt-4o-mini"} for r in runs.to_pylist()],
        schema=RUN_SCHEMA,
    )
    current = {**lexical, "judge_model": "gpt-4o-mini", "prompt_version": None, "threshold": None, "scale": None}
    found = find_baseline(mixed, dataset="faq", metric="contextual_recall", exclude_run_id="r7", current=current)
    assert found is not None and found["run_id"] == "r2"  # r3 is the latest, but scored by another judge
    only_other = {**current, "judge_model": "gpt-5"}
    found = find_baseline(mixed, dataset="faq", metric="contextual_recall", exclude_run_id="r7", current=only_other)
    assert found is not None and found["run_id"] == "r3"  # none comparable: the latest, to be called incomparable


def test_find_baseline_errors() -> None:
    runs = runs_table()
    with pytest.raises(ConfigError) as info:
        find_baseline(runs, dataset="faq", metric="contextual_recall", spec="label:staging")
    assert "'staging'" in str(info.value) and "'prod'" in str(info.value) and "'nightly'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        find_baseline(runs, dataset="faq", metric="contextual_recall", spec="run:nope")
    message = str(info.value)
    assert "'nope'" in message and "'r7'" in message and "'r3'" in message
    with pytest.raises(ConfigError, match="run being compared"):
        find_baseline(runs, dataset="faq", metric="contextual_recall", spec="r7", exclude_run_id="r7")
    # a dataset with no completed run lists none: never another dataset's runs as its own
    with pytest.raises(ConfigError) as info:
        find_baseline(runs, dataset="brand-new", metric="contextual_recall", spec="run:nope")
    assert str(info.value).endswith("recent runs of dataset 'brand-new' and metric 'contextual_recall': none")
    with pytest.raises(ConfigError, match="empty"):
        find_baseline(runs, dataset="faq", metric="contextual_recall", spec=" ")


def test_find_baseline_no_runs() -> None:
    empty = RUN_SCHEMA.empty_table()
    assert find_baseline(empty, dataset="faq", metric="contextual_recall") is None
    assert find_baseline(empty, dataset="faq", metric="contextual_recall", exclude_run_id="x") is None
    with pytest.raises(ConfigError, match="labels available: none"):
        find_baseline(empty, dataset="faq", metric="contextual_recall", spec="label:prod")


# -- outputs ----------------------------------------------------------------------------------------


def test_outputs() -> None:
    n = 1000
    cur, base, planted = planted_drop(n)
    seg = pa.array(["a" if i % 2 == 0 else "b" for i in range(n)], pa.string())
    cur, base = cur.append_column("segment", seg), base.append_column("segment", seg)
    cmp = compare_runs(
        cur, base, current_run=run_row("cur"), baseline_run=run_row("base"), segment_columns=["segment"], worst=3
    )
    rows = cmp.to_rows()
    assert len(rows) == 3
    assert all(list(r) == COMPARISON_SCHEMA.names for r in rows)
    table = pa.Table.from_pylist(rows, schema=COMPARISON_SCHEMA)
    assert table.schema == COMPARISON_SCHEMA
    assert set(table.column("comparison_id").to_pylist()) == {"cur__base"}
    overall = rows[0]
    assert overall["verdict"] == "regressed" and overall["mean_delta"] == -0.1
    assert overall["flips_pass_to_fail"] == 100 and overall["n_added"] == 0
    assert overall["compared_at"].tzinfo is not None

    md = comparison_markdown(cmp)
    assert md.startswith("## REGRESSED")
    assert cmp.worst_rows[0].row_id in md and planted[0] in md
    assert "lost: row3 s0" in md
    assert "| segment | a |" in md
    assert "| pass → fail / fail → pass | 100 / 0 |" in md  # no threshold given: none named
    assert "| pass → fail / fail → pass (a pass: score ≥ 0.7) | 100 / 0 |" in comparison_markdown(cmp, 0.7)

    payload = cmp.event_payload()
    decoded = json.loads(json.dumps(payload))
    assert decoded["verdict"] == "regressed"
    assert decoded["mean_delta"] == -0.1
    assert decoded["flips"] == {"pass_to_fail": 100, "fail_to_pass": 0}
    assert decoded["current_run_id"] == "cur" and decoded["baseline_run_id"] == "base"
    assert decoded["ci"][1] < 0 and decoded["p"] < 1e-10


def test_regression_still_exports_the_moved_names() -> None:
    """Users' ``from recall_tasks.analysis.regression import ...`` keeps working after the split."""
    from recall_tasks.analysis import baseline, comparability, regression, statistics, worst_rows

    assert regression.find_baseline is baseline.find_baseline
    assert regression.incomparable_reasons is comparability.incomparable_reasons
    assert regression.MIN_PAIRED_SHARE == comparability.MIN_PAIRED_SHARE
    assert regression.mcnemar_exact_p is statistics.mcnemar_exact_p
    assert regression.paired_mean_ci is statistics.paired_mean_ci
    assert regression.MCNEMAR_EXACT_MAX == statistics.MCNEMAR_EXACT_MAX
    assert regression.WorstRow is worst_rows.WorstRow
    assert regression.lost_statements is worst_rows.lost_statements
    assert all(hasattr(regression, name) for name in regression.__all__)


# -- scale ------------------------------------------------------------------------------------------


def _big(run_id: str, row_ids: pa.Array, scores: np.ndarray, segment: pa.Array) -> pa.Table:
    n = len(scores)
    statements = pa.array(np.char.add("s", np.arange(n).astype(str)))
    verdict = pa.array(np.where(scores >= 0.5, "yes", "no"))
    structs = pa.StructArray.from_arrays(
        [statements, verdict, pa.nulls(n, pa.string()), pa.nulls(n, pa.list_(pa.int32()))],
        fields=list(VERDICT_TYPE),
    )
    verdicts = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), structs)
    return pa.table(
        {
            "run_id": pa.array([run_id] * n),
            "row_id": row_ids,
            "score": pa.array(scores),
            "success": pa.array(scores >= 0.5),
            "verdicts": verdicts,
            "segment": segment,
        }
    )


def test_200k_rows() -> None:
    n = 200_000
    rng = np.random.default_rng(0)
    row_ids = pa.array(np.char.add("row-", np.arange(n).astype(str)))
    segment = pa.array(np.array(["a", "b", "c", "d"])[rng.integers(0, 4, n)])
    base_scores = rng.integers(0, 5, n) / 4
    cur_scores = base_scores.copy()
    drop = rng.random(n) < 0.05
    cur_scores[drop] = 0.0
    base = _big("base", row_ids, base_scores, segment)
    shuffled = rng.permutation(n)
    cur = _big("cur", row_ids, cur_scores, segment).take(pa.array(shuffled))
    started = time.perf_counter()
    cmp = compare_runs(cur, base, current_run=run_row("cur"), baseline_run=run_row("base"), segment_columns=["segment"])
    seconds = time.perf_counter() - started
    print(f"\n200k-row comparison: {seconds:.2f} s")
    assert cmp.n_paired == n
    assert cmp.mean_delta == pytest.approx(float((cur_scores - base_scores).mean()))
    assert cmp.verdict == "regressed"
    assert len(cmp.segments) == 4 and all(s.verdict == "regressed" for s in cmp.segments)
    assert len(cmp.worst_rows) == 10 and all(w.delta == -1.0 for w in cmp.worst_rows)
    assert all(w.lost == [f"s{w.row_id[4:]}"] for w in cmp.worst_rows)
