"""Regression checks: compare one run's per-row results with a baseline run's, row by row.

Pure functions over pyarrow tables (no Prefect, no I/O): :func:`find_baseline` picks the baseline run from the
``runs`` table, :func:`compare_runs` compares two runs' ``results`` rows and returns a :class:`Comparison`
(rows for a ``comparisons`` table, a Markdown report, a small event payload).

Pairing
    Rows are paired by ``row_id``. A pair counts only when the row was scored (``score`` not null, not NaN) in
    BOTH runs: errored and skipped rows are never averaged as 0. Rows only in the current run are ``n_added``,
    rows only in the baseline are ``n_removed``, rows in both runs but unscored in one (or both) are
    ``n_unpaired_unscored``. Row ids are unique per dataset; if a table repeats one anyway, its first
    occurrence is used and a warning is added. ``mean_current`` and ``mean_baseline`` are means over the
    PAIRED rows (so they can differ from the runs table's ``mean_score``, which averages every scored row), and
    ``mean_delta`` is the mean of the row-level deltas ``current - baseline``.

Interval of the mean delta
    A paired percentile bootstrap: the row-level deltas are resampled with replacement (``resamples`` times,
    ``numpy.random.default_rng(seed)``, in blocks of at most ~2M drawn indices to bound memory) and the 2.5th
    and 97.5th percentiles of the resampled means are the 95 % interval. Resampling the deltas (not the two
    runs independently) keeps the pairing, which removes the between-row variance that dominates recall scores.
    Above :data:`BOOTSTRAP_MAX_N` (20,000) paired rows the bootstrap distribution of a mean is normal to well
    within its own Monte-Carlo noise, so the normal interval ``mean ± 1.96·sd/√n`` of the paired deltas is used
    instead (the same cut-over as the run-level interval in :mod:`~recall_tasks.analysis.aggregates`). Deltas
    that are all exactly 0 give the interval (0, 0) by both methods.

Pass/fail flips: McNemar's exact test
    Over paired rows with a ``success`` in both runs, ``b`` rows went pass → fail and ``c`` went fail → pass.
    Under "no change" each discordant row is equally likely to flip either way, so ``min(b, c)`` is
    Binomial(b + c, 1/2); the two-sided p-value is ``min(1, 2 · P(X ≤ min(b, c)))`` (1 when ``b + c = 0``).
    It is computed with exact integer binomial coefficients (the recurrence
    ``C(n, k+1) = C(n, k)·(n−k)/(k+1)``, identical to ``math.comb``) and one correctly rounded division, up to
    :data:`MCNEMAR_EXACT_MAX` (20,000) discordant rows (~50 ms); above that the same tail sum is evaluated in
    log space (``lgamma`` plus a vectorised cumulative product), which agrees to ~1e-9 relative.

Verdict
    ``regressed`` when the drop is both material and certain (``mean_delta < -tolerance`` and ``ci_high < 0``)
    OR the pass→fail flips significantly outnumber the fail→pass flips (McNemar ``p < alpha`` and ``b > c``).
    ``improved`` is the mirror image. Otherwise ``unchanged``; ``no_overlap`` when no row could be paired.
    The flips rule is deliberately independent of ``tolerance``: 10 rows of 1,000 going from pass to fail with
    none coming back moves the mean by only −0.01 (inside a 0.02 tolerance) but is a significant, consistent
    loss (p = 2·0.5¹⁰ ≈ 0.002), so it is reported as ``regressed``. When the regression and improvement rules
    both fire (e.g. the mean drops materially while more rows cross the threshold upwards) the verdict is
    ``regressed`` (alert on the side of caution) and a warning explains the mixed signal.

Comparable or not
    Two runs are comparable only when what produces a score is the same: ``dataset_id`` (the normalised dataset
    URI, or ``--dataset-name``), ``metric``, ``units``, ``judge``,
    ``judge_model``, ``prompt_version``, ``schema_version``, ``splitter_version``, ``judge_config`` (the
    fingerprint of every judge setting that changes verdicts), ``threshold``, ``scale``, ``row_identity`` and
    ``dataset`` (the ``index_version``/``label`` is what is being compared). When any differs the verdict is
    ``incomparable`` and ``reason`` names every difference: a score change could be the judge's, not the
    retriever's, so no ``regressed``/``improved``/``unchanged`` is ever given. Fields recorded only by newer
    versions are ignored when the baseline lacks them, except ``row_identity``: a baseline without it was written
    when row ids hashed the retrieved contexts too, so its rows cannot pair with a re-indexed run's, and the
    verdict says so. A comparison whose matched rows cover less than :data:`MIN_PAIRED_SHARE` (90 %) of the
    baseline's rows is ``incomparable`` too, with the counts: a verdict over a sliver of the rows would mislead.
    The figures are still computed and recorded for inspection.

Segments
    For each segment column, the paired rows are grouped by the CURRENT run's value (the baseline's when the
    current table lacks the column; values as strings, null is its own segment) and each group gets the same
    figures (bootstrap per segment with the same seed, flips, McNemar p, verdict by the same rule). Segment
    verdicts are not corrected for multiple comparisons: the overall verdict is the one to alert on. Added and
    removed counts are run-level only (null on segment rows of the ``comparisons`` table).

Context precision (secondary)
    ``context_precision_delta`` is the mean change of the rows' context precision (from the same verdicts, see
    :mod:`recall_tasks.metrics.precision`) over the paired rows that have it in both runs. It never decides the
    verdict: recall is the metric; precision says whether the supporting chunks moved down the ranking.

Worst rows
    Up to ``worst`` paired rows whose score dropped (delta < 0), most negative first (ties: current table order),
    each with the statements ``lost``: "yes" in the baseline's verdicts and "no" or absent in the current
    verdicts, matched by statement text.

Cost
    Pairing is one hash lookup (``pyarrow.compute.index_in``) of the current row ids in the baseline's; scores
    and successes are gathered as numpy arrays; verdicts are read only for the worst rows. One million paired
    rows compare in a few seconds and well under 1 GB.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field

from recall_tasks.analysis.aggregates import BOOTSTRAP_MAX_N, mean_ci
from recall_tasks.errors import ConfigError
from recall_tasks.io.datasets import ROW_ID_COLUMN_IDENTITY
from recall_tasks.io.schemas import COMPARISON_SCHEMA
from recall_tasks.reports.markdown import md_code, md_text

__all__ = [
    "BOOTSTRAP_MAX_N",
    "Comparison",
    "MCNEMAR_EXACT_MAX",
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

ComparisonVerdict = Literal["regressed", "improved", "unchanged", "no_overlap", "incomparable"]

MCNEMAR_EXACT_MAX = 20_000
"""Up to this many discordant rows McNemar's p-value is computed with exact integers."""

#: Run fields that must be equal for a verdict; the second group is recorded only since row identity v2.
COMPARABLE_KEYS = ("dataset", "metric", "judge_model", "prompt_version", "threshold", "scale")
COMPARABLE_KEYS_V2 = ("dataset_id", "units", "judge", "schema_version", "splitter_version", "judge_config")

_COMPARISON_ORDER = ("dataset", "dataset_id", "metric", "units", "judge", "judge_model", "prompt_version",
                     "schema_version", "splitter_version", "judge_config", "threshold", "scale")  # fmt: skip
# a difference in a key on the right is implied by one on the left: only the first is named
_IMPLIED_BY = {
    "dataset_id": {"dataset"},
    "judge_model": {"judge"},
    "prompt_version": {"judge", "judge_model"},
    "schema_version": {"judge", "judge_model"},
    "judge_config": {"judge", "judge_model", "prompt_version", "schema_version", "splitter_version", "metric"},
}

MIN_PAIRED_SHARE = 0.9
"""Below this share of the baseline's rows matched by row id, the comparison is incomparable."""


# -- statistics -----------------------------------------------------------------------------------


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of ``min(b, c)`` out of ``b + c`` with p = 1/2.

    ``b`` and ``c`` are the discordant counts (pass→fail and fail→pass). Returns 1.0 when ``b + c == 0``.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    m = min(b, c)
    if n == 0 or 2 * m >= n:
        return 1.0
    if n <= MCNEMAR_EXACT_MAX:
        return _binomial_tail_exact(n, m)
    return _binomial_tail_log(n, m)


def _binomial_tail_exact(n: int, m: int) -> float:
    """``min(1, 2 · Σ_{k≤m} C(n, k) / 2ⁿ)`` with exact integers and one correctly rounded division."""
    term = 1  # C(n, 0)
    total = 1
    for k in range(m):
        term = term * (n - k) // (k + 1)  # C(n, k+1), exact
        total += term
    return min(1.0, (2 * total) / (1 << n))


def _binomial_tail_log(n: int, m: int) -> float:
    """The same tail as :func:`_binomial_tail_exact`, in log space (for large ``n``)."""
    log_pm = math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1) - n * math.log(2.0)
    if m == 0:
        rest = 0.0
    else:
        k = np.arange(m, 0, -1, dtype=np.float64)  # pmf(k-1)/pmf(k) = k / (n-k+1), all < 1 below the mode
        rest = float(np.cumprod(k / (n - k + 1.0)).sum())
    log_p = math.log(2.0) + log_pm + math.log1p(rest)
    return 1.0 if log_p >= 0 else math.exp(log_p)


def paired_mean_ci(deltas: np.ndarray, *, resamples: int = 2000, seed: int = 0) -> tuple[float | None, float | None]:
    """95 % interval of the mean of paired row-level ``deltas``: resampling the deltas keeps the pairing.

    Same estimator as the run-level interval (:func:`recall_tasks.analysis.aggregates.mean_ci`).
    """
    return mean_ci(np.asarray(deltas, dtype=np.float64), seed=seed, resamples=resamples)


def _decide(
    mean_delta: float | None,
    ci: tuple[float | None, float | None],
    b: int,
    c: int,
    p: float,
    *,
    tolerance: float,
    alpha: float,
) -> tuple[ComparisonVerdict, bool]:
    """The verdict, and whether the regression and improvement rules both fired (mixed signal)."""
    if mean_delta is None:
        return "no_overlap", False
    lo, hi = ci
    regressed = (mean_delta < -tolerance and hi is not None and hi < 0) or (p < alpha and b > c)
    improved = (mean_delta > tolerance and lo is not None and lo > 0) or (p < alpha and c > b)
    if regressed:
        return "regressed", improved
    if improved:
        return "improved", False
    return "unchanged", False


def lost_statements(
    baseline_verdicts: Sequence[dict[str, Any]] | None, current_verdicts: Sequence[dict[str, Any]] | None
) -> list[str]:
    """Statements judged "yes" in the baseline and "no" or absent in the current verdicts (by statement text).

    Baseline order is kept; a statement repeated in the baseline is listed once.
    """

    def is_yes(v: dict[str, Any]) -> bool:
        return str(v.get("verdict") or "").strip().lower() == "yes"

    still_yes = {v.get("statement") for v in current_verdicts or () if is_yes(v)}
    lost: list[str] = []
    seen: set[str] = set()
    for v in baseline_verdicts or ():
        statement = v.get("statement")
        if statement is None or not is_yes(v) or statement in still_yes or statement in seen:
            continue
        seen.add(statement)
        lost.append(statement)
    return lost


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


class WorstRow(BaseModel):
    """One of the paired rows whose score dropped the most."""

    row_id: str
    score_baseline: float
    score_current: float
    delta: float
    lost: list[str] = Field(default_factory=list)


def _fmt(value: float | None, digits: int = 4, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _fmt_p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.2e}"


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
    segments: list[SegmentDelta] = Field(default_factory=list)
    worst_rows: list[WorstRow] = Field(default_factory=list)
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
        }
        rows: list[dict[str, Any]] = [
            {
                **base,
                "segment_column": None,
                "segment_value": None,
                "verdict": self.verdict,
                "n_paired": self.n_paired,
                "n_added": self.n_added,
                "n_removed": self.n_removed,
                "n_unpaired_unscored": self.n_unpaired_unscored,
                "mean_current": self.mean_current,
                "mean_baseline": self.mean_baseline,
                "mean_delta": self.mean_delta,
                "ci_low": self.ci_low,
                "ci_high": self.ci_high,
                "flips_pass_to_fail": self.flips_pass_to_fail,
                "flips_fail_to_pass": self.flips_fail_to_pass,
                "mcnemar_p": self.mcnemar_p,
                "context_precision_delta": self.context_precision_delta,
            }
        ]
        for s in self.segments:
            rows.append(
                {
                    **base,
                    "segment_column": s.column,
                    "segment_value": s.value,
                    "verdict": s.verdict,
                    "n_paired": s.n_paired,
                    "n_added": None,
                    "n_removed": None,
                    "n_unpaired_unscored": None,
                    "mean_current": s.mean_current,
                    "mean_baseline": s.mean_baseline,
                    "mean_delta": s.mean_delta,
                    "ci_low": s.ci_low,
                    "ci_high": s.ci_high,
                    "flips_pass_to_fail": s.flips_pass_to_fail,
                    "flips_fail_to_pass": s.flips_fail_to_pass,
                    "mcnemar_p": s.mcnemar_p,
                    "context_precision_delta": None,
                }
            )
        return [{name: row[name] for name in COMPARISON_SCHEMA.names} for row in rows]

    def to_markdown(self) -> str:
        """A human report: verdict headline, figures, segments, worst rows with their lost statements."""
        verdict = self.verdict.upper().replace("_", " ")
        out = [f"## {verdict}: {md_text(self.metric or 'metric')} on {md_text(self.dataset or '?')}", ""]
        out.append(f"Run {md_code(self.current_run_id)} compared with baseline {md_code(self.baseline_run_id)}.")
        if self.reason:
            out.append("")
            out.append(f"**Incomparable**: {md_text(self.reason)}")
        if self.warnings:
            out.append("")
            out.extend(f"- ⚠ {md_text(w)}" for w in self.warnings)
        out += [
            "",
            "| figure | value |",
            "|---|---|",
            f"| paired rows | {self.n_paired} |",
            f"| added / removed rows | {self.n_added} / {self.n_removed} |",
            f"| in both, unscored in one | {self.n_unpaired_unscored} |",
            f"| mean (baseline → current) | {_fmt(self.mean_baseline)} → {_fmt(self.mean_current)} |",
            f"| mean delta | {_fmt(self.mean_delta, signed=True)} |",
            f"| 95 % CI of delta | [{_fmt(self.ci_low, signed=True)}, {_fmt(self.ci_high, signed=True)}] |",
            f"| pass → fail / fail → pass | {self.flips_pass_to_fail} / {self.flips_fail_to_pass} |",
            f"| McNemar exact p | {_fmt_p(self.mcnemar_p)} |",
            f"| context precision delta (secondary) | {_fmt(self.context_precision_delta, signed=True)} |",
            f"| tolerance / alpha | {self.tolerance:g} / {self.alpha:g} |",
        ]
        if self.segments:
            out += [
                "",
                "### Segments",
                "",
                "| column | value | paired | baseline | current | delta | 95 % CI | p→f / f→p | verdict |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for s in self.segments:
                value = md_text("(null)" if s.value is None else s.value, 200)
                out.append(
                    f"| {md_text(s.column)} | {value} | {s.n_paired} | "
                    f"{_fmt(s.mean_baseline)} | {_fmt(s.mean_current)} | {_fmt(s.mean_delta, signed=True)} | "
                    f"[{_fmt(s.ci_low, signed=True)}, {_fmt(s.ci_high, signed=True)}] | "
                    f"{s.flips_pass_to_fail} / {s.flips_fail_to_pass} | {s.verdict} |"
                )
        if self.worst_rows:
            out += ["", "### Largest drops", ""]
            for w in self.worst_rows:
                out.append(
                    f"- {md_code(w.row_id, 200)}: {_fmt(w.score_baseline, 3)} → {_fmt(w.score_current, 3)} "
                    f"({_fmt(w.delta, 3, signed=True)})"
                )
                out.extend(f"  - lost: {md_text(statement, 400)}" for statement in w.lost)
        return "\n".join(out) + "\n"

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
            "warnings": list(self.warnings),
        }


# -- baseline selection ---------------------------------------------------------------------------


def _strings(table: pa.Table, name: str) -> pa.ChunkedArray:
    """A column as plain strings (dictionary-encoded partition columns included)."""
    col = table.column(name)
    return col if col.type == pa.string() else pc.cast(col, pa.string())


def _eq(table: pa.Table, name: str, value: str) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(_strings(table, name), value), False)


def _most_recent_first(table: pa.Table) -> pa.Table:
    keys = [(k, "descending") for k in ("finished_at", "started_at", "run_id") if k in table.column_names]
    return table.sort_by(keys) if keys else table  # nulls sort last (the default)


def _distinct_recent(table: pa.Table, name: str, limit: int = 10) -> list[str]:
    """Distinct non-null values of a column, most recent run first."""
    if name not in table.column_names:
        return []
    seen: list[str] = []
    for value in _strings(_most_recent_first(table), name).to_pylist():
        if value is not None and value not in seen:
            seen.append(value)
            if len(seen) == limit:
                break
    return seen


def _shown(values: list[str]) -> str:
    return ", ".join(repr(v) for v in values) if values else "none"


def find_baseline(
    runs: pa.Table,
    *,
    dataset: str,
    metric: str,
    spec: str = "latest",
    exclude_run_id: str | None = None,
    current: dict[str, Any] | None = None,
    dataset_id: str | None = None,
) -> dict[str, Any] | None:
    """The overall ``runs`` row of the baseline run chosen by ``spec``, or None when there is none yet.

    ``spec``:
    - ``"latest"``: the most recent (``finished_at``) completed run of the same dataset and metric, other than
      ``exclude_run_id``, preferring runs comparable with ``current`` (the current run's settings, see
      :func:`incomparable_reasons`): with one judge configuration interrupted by another, each run is compared
      with the latest run of its own configuration. When no run is comparable, the latest one is returned (the
      comparison then says ``incomparable`` and why); None when the series is empty (the first run);
    - ``"label:<label>"``: the most recent completed run with that label, same dataset and metric, other than
      ``exclude_run_id``, comparable ones first;
    - ``"run:<run_id>"`` or a bare run id: that run (an explicit choice), unless it failed or has not finished
      (a failed run is never a baseline); preferably its row for ``dataset``/``metric``, else its only overall
      row (a mismatch is then flagged by :func:`compare_runs`).

    The series is the runs of ``dataset_id`` (a normalised URI or ``name:<--dataset-name>``) when given, so two
    unrelated datasets that share a file name never pair; runs recorded before ``dataset_id`` existed match by
    ``dataset`` name. Only overall rows (``segment_column`` null) are considered. An explicit label or run id
    that matches nothing raises :class:`ConfigError` listing some that exist.
    """
    spec = (spec or "").strip()
    if not spec:
        raise ConfigError("baseline spec is empty; use 'latest', 'label:<label>', 'run:<run_id>' or a run id")
    for required in ("run_id", "dataset", "metric"):
        if required not in runs.column_names:
            raise ConfigError(f"the runs table has no {required!r} column; columns: {runs.column_names}")

    overall = runs
    if "segment_column" in runs.column_names:
        overall = runs.filter(pc.is_null(runs.column("segment_column")))
    same_dataset = _eq(overall, "dataset", dataset)
    if dataset_id is not None and "dataset_id" in overall.column_names:
        ids = _strings(overall, "dataset_id")
        same_dataset = pc.or_(pc.fill_null(pc.equal(ids, dataset_id), False), pc.and_(pc.is_null(ids), same_dataset))
    series = overall.filter(pc.and_(same_dataset, _eq(overall, "metric", metric)))
    completed = series
    if "status" in series.column_names:
        completed = series.filter(_eq(series, "status", "completed"))
    if exclude_run_id is not None:
        completed = completed.filter(pc.invert(_eq(completed, "run_id", exclude_run_id)))

    def first(table: pa.Table) -> dict[str, Any] | None:
        if table.num_rows == 0:
            return None
        rows: list[dict[str, Any]] = _most_recent_first(table).to_pylist()
        if current is not None:
            for row in rows:
                if not incomparable_reasons(current, row):
                    return row
        return rows[0]

    if spec.lower() == "latest":
        return first(completed)

    if spec.startswith("label:"):
        label = spec[len("label:") :].strip()
        if not label:
            raise ConfigError("baseline spec 'label:' needs a label, e.g. 'label:prod'")
        if "label" not in completed.column_names:
            raise ConfigError(f"no run labelled {label!r}: the runs table has no 'label' column")
        found = first(completed.filter(_eq(completed, "label", label)))
        if found is None:
            raise ConfigError(
                f"no completed run labelled {label!r} for dataset {dataset!r} and metric {metric!r}"
                f"{' other than the current run' if exclude_run_id else ''}; "
                f"labels available: {_shown(_distinct_recent(completed, 'label'))}"
            )
        return found

    run_id = spec[len("run:") :].strip() if spec.startswith("run:") else spec
    if not run_id:
        raise ConfigError("baseline spec 'run:' needs a run id, e.g. 'run:20240601-abcdef'")
    if exclude_run_id is not None and run_id == exclude_run_id:
        raise ConfigError(f"the baseline run {run_id!r} is the run being compared; choose an earlier run")
    candidates = overall.filter(_eq(overall, "run_id", run_id))
    if candidates.num_rows == 0:
        recent = _distinct_recent(completed if completed.num_rows else overall, "run_id")
        raise ConfigError(
            f"no run with id {run_id!r} in the runs table; recent runs of dataset {dataset!r} and metric "
            f"{metric!r}: {_shown(recent)}"
        )
    same_series = candidates.filter(pc.and_(_eq(candidates, "dataset", dataset), _eq(candidates, "metric", metric)))
    chosen: dict[str, Any] = _most_recent_first(same_series if same_series.num_rows else candidates).to_pylist()[0]
    status = chosen.get("status")
    if status not in (None, "completed", "budget_exhausted"):
        raise ConfigError(
            f"run {run_id!r} has status {status!r}: a failed or unfinished run is never a baseline; "
            f"completed runs of dataset {dataset!r}: {_shown(_distinct_recent(completed, 'run_id'))}"
        )
    return chosen


# -- comparison -----------------------------------------------------------------------------------


def _first_occurrences(table: pa.Table, label: str, warnings: list[str]) -> pa.Table:
    """The table with one row per ``row_id`` (the first), warning when ids repeat."""
    ids = table.column("row_id")
    if len(pc.unique(ids)) == table.num_rows:
        return table
    first = pc.index_in(ids, value_set=ids.combine_chunks()).to_numpy(zero_copy_only=False)
    keep = np.flatnonzero(first == np.arange(table.num_rows))
    warnings.append(
        f"the {label} results repeat {table.num_rows - len(keep)} row id(s); the first occurrence of each was used"
    )
    return table.take(pa.array(keep))


def _scores(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Scores as float64 and the mask of scored rows (not null, not NaN)."""
    col = pc.cast(table.column("score"), pa.float64())
    values = pc.fill_null(col, 0.0).to_numpy()
    scored = pc.is_valid(col).to_numpy(zero_copy_only=False) & ~np.isnan(values)
    return np.asarray(values, dtype=np.float64), np.asarray(scored, dtype=bool)


def _successes(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Success as bool and the mask of rows that have one."""
    col = pc.cast(table.column("success"), pa.bool_())
    known = pc.is_valid(col).to_numpy(zero_copy_only=False)
    return np.asarray(pc.fill_null(col, False).to_numpy(zero_copy_only=False), dtype=bool), np.asarray(known, bool)


def _run_id(run: dict[str, Any], table: pa.Table, label: str) -> str:
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


def incomparable_reasons(current_run: dict[str, Any], baseline_run: dict[str, Any]) -> list[str]:
    """What makes two runs' scores incomparable (empty when they are comparable); see the module docstring."""
    reasons = []
    differs = set()
    for key in _COMPARISON_ORDER:
        a, b = current_run.get(key), baseline_run.get(key)
        if key in COMPARABLE_KEYS_V2 and b is None:
            continue  # the baseline predates this field
        if a != b:
            differs.add(key)
            if not differs & _IMPLIED_BY.get(key, set()):  # "judge differs" says it all: not also its model
                reasons.append(f"{key} differs (current {a!r}, baseline {b!r})")
    if current_run.get("row_identity") != baseline_run.get("row_identity"):
        if baseline_run.get("row_identity") is None:
            if current_run.get("row_identity") != ROW_ID_COLUMN_IDENTITY:
                reasons.append(
                    "the baseline was recorded before row identity v2 (its row ids hashed the retrieved contexts, "
                    "so they cannot pair with this run's); compare with a run recorded since"
                )
        else:
            reasons.append(
                f"row_identity differs (current {current_run.get('row_identity')!r}, "
                f"baseline {baseline_run.get('row_identity')!r})"
            )
    return reasons


def _figures(
    sc: np.ndarray,
    sb: np.ndarray,
    succ_c: np.ndarray,
    succ_b: np.ndarray,
    known: np.ndarray,
    *,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """Means, interval, flips and McNemar p of paired arrays."""
    n = len(sc)
    if n == 0:
        return {
            "n_paired": 0, "mean_current": None, "mean_baseline": None, "mean_delta": None,
            "ci_low": None, "ci_high": None, "flips_pass_to_fail": 0, "flips_fail_to_pass": 0, "mcnemar_p": 1.0,
        }  # fmt: skip
    deltas = sc - sb
    lo, hi = paired_mean_ci(deltas, resamples=resamples, seed=seed)
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


def _verdict_of(fig: dict[str, Any], *, tolerance: float, alpha: float) -> tuple[ComparisonVerdict, bool]:
    return _decide(
        fig["mean_delta"],
        (fig["ci_low"], fig["ci_high"]),
        fig["flips_pass_to_fail"],
        fig["flips_fail_to_pass"],
        fig["mcnemar_p"],
        tolerance=tolerance,
        alpha=alpha,
    )


def compare_runs(
    current: pa.Table,
    baseline: pa.Table,
    *,
    current_run: dict[str, Any],
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
    ``prompt_version``...). See the module docstring for the pairing, the statistics and the verdict rule.
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
    uri_a, uri_b = current_run.get("dataset_uri"), baseline_run.get("dataset_uri")
    if uri_a and uri_b and uri_a != uri_b:
        warnings.append(f"the baseline's dataset URI differs (current {uri_a!r}, baseline {uri_b!r})")

    current = _first_occurrences(current, "current", warnings)
    baseline = _first_occurrences(baseline, "baseline", warnings)
    cur_ids = pc.cast(current.column("row_id"), pa.large_string()).combine_chunks()
    base_ids = pc.cast(baseline.column("row_id"), pa.large_string()).combine_chunks()

    # Pairing: position of each current row in the baseline (-1 when absent).
    found = pc.index_in(cur_ids, value_set=base_ids)
    in_base = np.asarray(found.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    base_index = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    cur_score, cur_scored = _scores(current)
    base_score, base_scored = _scores(baseline)
    n_matched = int(np.count_nonzero(in_base))
    paired = in_base & cur_scored
    paired[paired] = base_scored[base_index[paired]]
    cur_pos = np.flatnonzero(paired)
    base_pos = base_index[cur_pos]

    sc, sb = cur_score[cur_pos], base_score[base_pos]
    cur_succ, cur_known = _successes(current)
    base_succ, base_known = _successes(baseline)
    succ_c, succ_b = cur_succ[cur_pos], base_succ[base_pos]
    known = cur_known[cur_pos] & base_known[base_pos]
    if len(cur_pos) and not known.all():
        warnings.append(f"{int(np.count_nonzero(~known))} paired row(s) lack a success value; left out of the flips")

    fig = _figures(sc, sb, succ_c, succ_b, known, resamples=resamples, seed=seed)
    precision_delta = None
    if "context_precision" in current.column_names and "context_precision" in baseline.column_names:
        pc_cur = pc.cast(current.column("context_precision"), pa.float64()).to_numpy(zero_copy_only=False)
        pc_base = pc.cast(baseline.column("context_precision"), pa.float64()).to_numpy(zero_copy_only=False)
        a, b = np.asarray(pc_cur, float)[cur_pos], np.asarray(pc_base, float)[base_pos]
        both = ~np.isnan(a) & ~np.isnan(b)
        precision_delta = float((a[both] - b[both]).mean()) if both.any() else None
    verdict, mixed = _verdict_of(fig, tolerance=tolerance, alpha=alpha)
    if baseline.num_rows and n_matched < MIN_PAIRED_SHARE * baseline.num_rows:
        reasons.append(
            f"only {n_matched} of the baseline's {baseline.num_rows} rows ({n_matched / baseline.num_rows:.0%}) "
            f"pair with this run's by row id (at least {MIN_PAIRED_SHARE:.0%} needed); {current.num_rows - n_matched}"
            " rows are new in this run"
        )
    if reasons:
        verdict, mixed = "incomparable", False
    if verdict == "no_overlap":
        warnings.append("no row was scored in both runs: nothing to compare")
    if mixed:
        warnings.append(
            "mixed signal: the regression and the improvement rules both fired (mean and pass/fail flips disagree);"
            " reported as regressed"
        )

    segments: list[SegmentDelta] = []
    for column in segment_columns:
        if column in current.column_names:
            values = current.column(column).take(pa.array(cur_pos))
        elif column in baseline.column_names:
            values = baseline.column(column).take(pa.array(base_pos))
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
            seg = _figures(
                sc[members], sb[members], succ_c[members], succ_b[members], known[members],
                resamples=resamples, seed=seed,
            )  # fmt: skip
            seg_verdict, _ = _verdict_of(seg, tolerance=tolerance, alpha=alpha)
            if reasons:
                seg_verdict = "incomparable"
            segments.append(SegmentDelta(column=column, value=value, verdict=seg_verdict, **seg))

    worst_rows: list[WorstRow] = []
    if worst > 0 and len(cur_pos):
        deltas = sc - sb
        dropped = np.flatnonzero(deltas < 0)
        if len(dropped) > worst:
            # the `worst` smallest deltas, with every row tied at the cut-off, then a stable full order
            cut = np.partition(deltas[dropped], worst - 1)[worst - 1]
            dropped = dropped[deltas[dropped] <= cut]
        chosen = dropped[np.lexsort((dropped, deltas[dropped]))][:worst]
        take_cur = pa.array(cur_pos[chosen])
        take_base = pa.array(base_pos[chosen])
        ids = cur_ids.take(take_cur).to_pylist()
        has_verdicts = "verdicts" in current.column_names and "verdicts" in baseline.column_names
        cur_v = current.column("verdicts").take(take_cur).to_pylist() if has_verdicts else [None] * len(chosen)
        base_v = baseline.column("verdicts").take(take_base).to_pylist() if has_verdicts else [None] * len(chosen)
        for k, i in enumerate(chosen):
            worst_rows.append(
                WorstRow(
                    row_id=str(ids[k]),
                    score_baseline=float(sb[i]),
                    score_current=float(sc[i]),
                    delta=float(deltas[i]),
                    lost=lost_statements(base_v[k], cur_v[k]),
                )
            )

    return Comparison(
        current_run_id=current_run_id,
        baseline_run_id=baseline_run_id,
        dataset=current_run.get("dataset"),
        metric=current_run.get("metric"),
        tolerance=tolerance,
        alpha=alpha,
        verdict=verdict,
        like_for_like=not reasons,
        reason="; ".join(reasons) or None,
        warnings=warnings,
        n_added=current.num_rows - n_matched,
        n_removed=baseline.num_rows - n_matched,
        n_unpaired_unscored=n_matched - len(cur_pos),
        segments=segments,
        worst_rows=worst_rows,
        context_precision_delta=precision_delta,
        **fig,
    )
