"""Regression checks: compare one run's per-row results with a baseline run's, row by row.

Pure functions over pyarrow tables (no Prefect, no I/O): :func:`compare_runs` compares two runs' ``results``
rows and returns a :class:`Comparison` (rows for the ``comparisons`` table, a small event payload; the Markdown
view is ``recall_tasks.reports.comparison``). The statistics are in :mod:`~recall_tasks.analysis.statistics`,
the baseline selection in :mod:`~recall_tasks.analysis.baseline`, what makes two runs comparable in
:mod:`~recall_tasks.analysis.comparability`, the worst rows in :mod:`~recall_tasks.analysis.worst_rows`. The
rules (pairing, interval, McNemar, verdict, comparability, segments, context precision, worst rows, cost) are in
docs/regression.md.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field

from recall_tasks.analysis.aggregates import MIN_INTERVAL_ROWS, too_few_rows
from recall_tasks.analysis.baseline import find_baseline
from recall_tasks.analysis.comparability import (
    COMPARABLE_KEYS,
    COMPARABLE_KEYS_V2,
    MIN_PAIRED_SHARE,
    incomparable_reasons,
    paired_share_reason,
)
from recall_tasks.analysis.drift import DRIFT_REASON, canary_note, judge_drift
from recall_tasks.analysis.pairing import Pairs, pair_rows
from recall_tasks.analysis.statistics import BOOTSTRAP_MAX_N, MCNEMAR_EXACT_MAX, mcnemar_exact_p, paired_mean_ci
from recall_tasks.analysis.worst_rows import WorstRow, lost_statements, worst_rows
from recall_tasks.errors import ConfigError
from recall_tasks.io.schemas import COMPARISON_SCHEMA

__all__ = [
    "BOOTSTRAP_MAX_N",
    "COMPARABLE_KEYS",
    "COMPARABLE_KEYS_V2",
    "Comparison",
    "MCNEMAR_EXACT_MAX",
    "MIN_INTERVAL_ROWS",
    "MIN_PAIRED_SHARE",
    "SegmentDelta",
    "ComparisonVerdict",
    "WorstRow",
    "compare_runs",
    "find_baseline",
    "incomparable_reasons",
    "lost_statements",
    "mcnemar_exact_p",
    "paired_mean_ci",
]

ComparisonVerdict = Literal["regressed", "improved", "unchanged", "no_overlap", "too_few_rows", "incomparable"]

#: The figures of a paired comparison, overall (:class:`Comparison`) and per segment (:class:`SegmentDelta`).
_FIGURES = ("n_paired", "mean_current", "mean_baseline", "mean_delta", "ci_low", "ci_high", "flips_pass_to_fail",
           "flips_fail_to_pass", "mcnemar_p")  # fmt: skip


# -- verdict --------------------------------------------------------------------------------------


def _verdict_of(fig: dict[str, Any], *, tolerance: float, alpha: float) -> tuple[ComparisonVerdict, bool]:
    """The verdict of a comparison's figures, and whether the regression and improvement rules both fired."""
    mean_delta, lo, hi = fig["mean_delta"], fig["ci_low"], fig["ci_high"]
    if mean_delta is None:
        return "no_overlap", False
    if fig["n_paired"] < MIN_INTERVAL_ROWS:  # no interval, and McNemar's flips alone decide nothing either
        return "too_few_rows", False
    b, c, p = fig["flips_pass_to_fail"], fig["flips_fail_to_pass"], fig["mcnemar_p"]
    regressed = (mean_delta < -tolerance and hi is not None and hi < 0) or (p < alpha and b > c)
    improved = (mean_delta > tolerance and lo is not None and lo > 0) or (p < alpha and c > b)
    if regressed:
        return "regressed", improved
    if improved:
        return "improved", False
    return "unchanged", False


# -- result model ---------------------------------------------------------------------------------


class SegmentDelta(BaseModel):
    """The comparison restricted to the paired rows of one segment value."""

    column: str
    value: str | None
    n_paired: int
    mean_current: float | None
    mean_baseline: float | None
    mean_delta: float | None
    ci_low: float | None
    ci_high: float | None
    flips_pass_to_fail: int = 0
    flips_fail_to_pass: int = 0
    mcnemar_p: float = 1.0
    verdict: ComparisonVerdict = "unchanged"
    #: why the segment has no interval (too few paired rows); None otherwise
    reason: str | None = None


class Comparison(BaseModel):
    """The outcome of comparing a run's per-row results with a baseline run's."""

    current_run_id: str
    baseline_run_id: str
    dataset: str | None
    metric: str | None
    tolerance: float
    alpha: float
    verdict: ComparisonVerdict
    like_for_like: bool
    reason: str | None = None
    warnings: list[str] = Field(default_factory=list)
    n_paired: int
    n_added: int
    n_removed: int
    n_unpaired_unscored: int
    mean_current: float | None
    mean_baseline: float | None
    mean_delta: float | None
    ci_low: float | None
    ci_high: float | None
    flips_pass_to_fail: int
    flips_fail_to_pass: int
    mcnemar_p: float
    context_precision_delta: float | None = None
    #: the baseline run's own overall mean and 95 % interval (its ``runs`` row; None when not recorded)
    baseline_run_mean: float | None = None
    baseline_run_ci: tuple[float | None, float | None] = (None, None)
    segments: list[SegmentDelta] = Field(default_factory=list)
    worst_rows: list[WorstRow] = Field(default_factory=list)
    #: the runs' canary agreement moved beyond its interval (the verdict is then ``incomparable``, see drift.py)
    judge_drift: bool = False
    #: both runs' canary figures and their changes (``drift.Drift.payload``), when both judged the same canary
    canary: dict[str, Any] | None = None
    compared_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @property
    def comparison_id(self) -> str:
        """``<current_run_id>__<baseline_run_id>``: the key of this comparison's rows."""
        return f"{self.current_run_id}__{self.baseline_run_id}"

    def to_rows(self) -> list[dict[str, Any]]:
        """Rows for the ``comparisons`` table (:data:`COMPARISON_SCHEMA`): overall first, then one per segment."""
        base = {
            "comparison_id": self.comparison_id,
            "current_run_id": self.current_run_id,
            "baseline_run_id": self.baseline_run_id,
            "dataset": self.dataset,
            "metric": self.metric,
            "like_for_like": self.like_for_like,
            "reason": self.reason,
            "tolerance": self.tolerance,
            "alpha": self.alpha,
            "compared_at": self.compared_at,
            "judge_drift": self.judge_drift,
        }
        overall = {"segment_column": None, "segment_value": None, "verdict": self.verdict, "n_added": self.n_added,
                   "n_removed": self.n_removed, "n_unpaired_unscored": self.n_unpaired_unscored,
                   "context_precision_delta": self.context_precision_delta}  # fmt: skip
        rows: list[dict[str, Any]] = [{**base, **overall, **{k: getattr(self, k) for k in _FIGURES}}]
        for s in self.segments:
            segment = {"segment_column": s.column, "segment_value": s.value, "verdict": s.verdict, "n_added": None,
                       "n_removed": None, "n_unpaired_unscored": None, "context_precision_delta": None}  # fmt: skip
            reason = {"reason": s.reason} if s.reason is not None else {}
            rows.append({**base, **segment, **reason, **{k: getattr(s, k) for k in _FIGURES}})
        return [{name: row[name] for name in COMPARISON_SCHEMA.names} for row in rows]

    def event_payload(self) -> dict[str, Any]:
        """A small JSON-safe summary for an event or a notification."""
        return {
            "verdict": self.verdict,
            "current_run_id": self.current_run_id,
            "baseline_run_id": self.baseline_run_id,
            "dataset": self.dataset,
            "metric": self.metric,
            "like_for_like": self.like_for_like,
            "reason": self.reason,
            "n_paired": self.n_paired,
            "n_baseline": self.n_paired + self.n_removed + self.n_unpaired_unscored,
            "mean_delta": self.mean_delta,
            "ci": [self.ci_low, self.ci_high],
            "flips": {"pass_to_fail": self.flips_pass_to_fail, "fail_to_pass": self.flips_fail_to_pass},
            "p": self.mcnemar_p,
            "context_precision_delta": self.context_precision_delta,
            "judge_drift": self.judge_drift,
            "canary": self.canary,
            "warnings": list(self.warnings),
        }


# -- comparison -----------------------------------------------------------------------------------


def _run_id(run: Mapping[str, Any], table: pa.Table, label: str) -> str:
    value = run.get("run_id")
    if value:
        return str(value)
    if "run_id" in table.column_names and table.num_rows:
        ids = pc.unique(table.column("run_id")).to_pylist()
        if len(ids) == 1 and ids[0] is not None:
            return str(ids[0])
    raise ConfigError(f"the {label} run has no run_id")


def _check_table(table: pa.Table, label: str) -> None:
    missing = [c for c in ("row_id", "score", "success") if c not in table.column_names]
    if missing:
        raise ConfigError(f"the {label} results lack column(s) {missing}; columns: {table.column_names}")
    if "run_id" in table.column_names and pc.count_distinct(table.column("run_id")).as_py() > 1:
        raise ConfigError(f"the {label} results hold several runs; pass the rows of one run")


def _figures(pairs: Pairs, members: np.ndarray | slice = slice(None), *, resamples: int, seed: int) -> dict[str, Any]:
    """Means, interval, flips and McNemar p of the pairs (or of the pairs at positions ``members``)."""
    sc, sb = pairs.score_current[members], pairs.score_baseline[members]
    n = len(sc)
    if n == 0:
        return {
            "n_paired": 0, "mean_current": None, "mean_baseline": None, "mean_delta": None,
            "ci_low": None, "ci_high": None, "flips_pass_to_fail": 0, "flips_fail_to_pass": 0, "mcnemar_p": 1.0,
        }  # fmt: skip
    succ_c, succ_b, known = pairs.success_current[members], pairs.success_baseline[members], pairs.known[members]
    deltas = sc - sb
    lo, hi = paired_mean_ci(deltas, resamples=resamples, seed=seed) if n >= MIN_INTERVAL_ROWS else (None, None)
    b = int(np.count_nonzero(known & succ_b & ~succ_c))
    c = int(np.count_nonzero(known & ~succ_b & succ_c))
    return {
        "n_paired": n,
        "mean_current": float(sc.mean()),
        "mean_baseline": float(sb.mean()),
        "mean_delta": float(deltas.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "flips_pass_to_fail": b,
        "flips_fail_to_pass": c,
        "mcnemar_p": mcnemar_exact_p(b, c),
    }


def _segments(
    pairs: Pairs,
    columns: Sequence[str],
    *,
    incomparable: bool,
    tolerance: float,
    alpha: float,
    resamples: int,
    seed: int,
) -> list[SegmentDelta]:
    """The figures per value of each segment column (the current run's value, else the baseline's)."""
    current, baseline = pairs.current, pairs.baseline
    segments: list[SegmentDelta] = []
    for column in columns:
        if column in current.column_names:
            values = current.column(column).take(pa.array(pairs.cur_pos))
        elif column in baseline.column_names:
            values = baseline.column(column).take(pa.array(pairs.base_pos))
        else:
            raise ConfigError(f"segment column {column!r} is in neither run's results; columns: {current.column_names}")
        encoded = pc.dictionary_encode(pc.cast(values, pa.string()), null_encoding="encode").combine_chunks()
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        names: list[str | None] = encoded.dictionary.to_pylist()
        order = np.argsort(codes, kind="stable")
        bounds = np.cumsum(np.bincount(codes, minlength=len(names)))
        groups = np.split(order, bounds[:-1])
        for value, members in sorted(zip(names, groups, strict=True), key=lambda g: (g[0] is None, g[0] or "")):
            if len(members) == 0:
                continue
            seg = _figures(pairs, members, resamples=resamples, seed=seed)
            seg_verdict, _ = _verdict_of(seg, tolerance=tolerance, alpha=alpha)
            reason = too_few_rows(seg["n_paired"], " paired") if seg_verdict == "too_few_rows" else None
            if incomparable:
                seg_verdict, reason = "incomparable", None
            segments.append(SegmentDelta(column=column, value=value, verdict=seg_verdict, reason=reason, **seg))
    return segments


def compare_runs(
    current: pa.Table,
    baseline: pa.Table,
    *,
    current_run: Mapping[str, Any],
    baseline_run: dict[str, Any],
    tolerance: float = 0.02,
    alpha: float = 0.05,
    segment_columns: Sequence[str] = (),
    worst: int = 10,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Compare the per-row results of one run (``current``) with those of another (``baseline``).

    ``current`` and ``baseline`` hold the ``results`` rows of one run each (at least ``row_id``, ``score``,
    ``success``; ``verdicts`` for the lost statements; segment columns as needed). ``current_run`` and
    ``baseline_run`` are the runs' overall ``runs`` rows (``run_id``, ``dataset``, ``metric``, ``judge_model``,
    ``prompt_version``...). See docs/regression.md for the pairing, the statistics and the verdict rule.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    _check_table(current, "current")
    _check_table(baseline, "baseline")
    warnings: list[str] = []
    current_run_id = _run_id(current_run, current, "current")
    baseline_run_id = _run_id(baseline_run, baseline, "baseline")
    if current_run_id == baseline_run_id:
        warnings.append("the baseline is the current run itself")
    reasons = incomparable_reasons(current_run, baseline_run)
    drift = judge_drift(current_run, baseline_run)
    note = canary_note(current_run, baseline_run)
    if note is not None:
        warnings.append(note)
    uri_a, uri_b = current_run.get("dataset_uri"), baseline_run.get("dataset_uri")
    named = str(current_run.get("dataset_id") or "").startswith("name:")  # --dataset-name: the location may move
    if (
        uri_a
        and uri_b
        and uri_a != uri_b
        and not (
            named
            and current_run.get("dataset_id") in (baseline_run.get("dataset_id"), f"name:{baseline_run.get('dataset')}")
        )
    ):
        warnings.append(f"the baseline's dataset URI differs (current {uri_a!r}, baseline {uri_b!r})")

    pairs = pair_rows(current, baseline, warnings)
    n_current, n_baseline, n_matched = pairs.current.num_rows, pairs.baseline.num_rows, pairs.n_matched
    fig = _figures(pairs, resamples=resamples, seed=seed)
    precision_delta = pairs.mean_delta_of("context_precision")
    verdict, mixed = _verdict_of(fig, tolerance=tolerance, alpha=alpha)
    share = paired_share_reason(n_matched, n_baseline, n_current)
    if share is not None:
        reasons.append(share)
    if reasons:
        verdict, mixed = "incomparable", False
    reason = "; ".join(reasons) or (too_few_rows(fig["n_paired"], " paired") if verdict == "too_few_rows" else None)
    if verdict == "no_overlap":
        warnings.append("no row was scored in both runs: nothing to compare")
    if mixed:
        warnings.append(
            "mixed signal: the regression and the improvement rules both fired (mean and pass/fail flips disagree);"
            " reported as regressed"
        )

    segments = _segments(
        pairs, segment_columns, incomparable=bool(reasons), tolerance=tolerance, alpha=alpha, resamples=resamples,
        seed=seed,
    )  # fmt: skip
    return Comparison(
        current_run_id=current_run_id,
        baseline_run_id=baseline_run_id,
        dataset=current_run.get("dataset"),
        metric=current_run.get("metric"),
        tolerance=tolerance,
        alpha=alpha,
        verdict=verdict,
        like_for_like=not reasons,
        reason=reason,
        warnings=warnings,
        n_added=n_current - n_matched,
        n_removed=n_baseline - n_matched,
        n_unpaired_unscored=n_matched - len(pairs.cur_pos),
        segments=segments,
        worst_rows=worst_rows(pairs, worst),
        context_precision_delta=precision_delta,
        baseline_run_mean=baseline_run.get("mean_score"),
        baseline_run_ci=(baseline_run.get("ci_low"), baseline_run.get("ci_high")),
        judge_drift=any(r.startswith(DRIFT_REASON) for r in reasons),
        canary=None if drift is None else drift.payload(current_run, baseline_run),
        **fig,
    )
