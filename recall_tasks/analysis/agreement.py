"""How well a judge agrees with human labels: pure functions over paired verdicts, with bootstrap intervals.

Input: one :class:`PairedRow` per labelled row: the human verdict of each unit (sentence or context item;
``True`` = supported), the judge's verdict of the same units, optionally a category, and optionally row scores
(a row labelled only with an expected score has no unit verdicts; its human score is that number).

Figures (:func:`agreement`), "positive" meaning *supported*:

- ``accuracy``: share of units where judge and human agree;
- ``kappa``: Cohen's κ, (p_o - p_e) / (1 - p_e), agreement corrected for chance (raw agreement overstates a
  judge on a set that is mostly one class);
- ``tpr``: of the units humans call supported, the share the judge calls supported (sensitivity);
- ``tnr``: of the units humans call unsupported, the share the judge calls unsupported (specificity);
- ``mae``: mean absolute difference of the row scores (0..1), over rows that have both;
- ``spearman``: Spearman rank correlation of the row scores (ties get average ranks).

Intervals: percentile bootstrap, 95 % by default, resampling ROWS with replacement (units of one row share a
reference and a context, so they are not independent; resampling units would give intervals that are too
narrow). ``resamples`` (2000) replicates from ``numpy.random.default_rng(seed)``: the same rows and seed give
the same interval, always. A replicate where a figure is undefined (e.g. it drew no unsupported unit, so TNR has
no denominator) is left out of that figure's interval; ``Figure.undefined_share`` says how many were. Below
:data:`~recall_tasks.analysis.aggregates.MIN_INTERVAL_ROWS` rows no figure has an interval (``low``/``high``
None, ``reason`` "too few rows: ..."): one row resampled is always itself, a zero-width interval that claims
certainty, and below ten rows the bootstrap covers far less than it says (docs/regression.md, "Too few rows").

Undefined figures are ``None`` with the reason, never a made-up 0 or 1:
- κ when the human labels are all one class (κ then measures nothing: it is 0 whenever the judge says anything
  else, and 0/0 when it agrees on everything), or when there are no units;
- TPR without a human-supported unit, TNR without a human-unsupported unit;
- MAE without a row with both scores; Spearman with fewer than 3 such rows or when either side's scores are all
  equal (a rank correlation of a constant is 0/0).

Whether two agreements differ (the judge drifted): :func:`compare` resamples the rows of both (jointly when both
are the same rows, matched by ``key``: a paired bootstrap; independently otherwise) and takes the bootstrap
interval of the DIFFERENCE b - a; the two differ when that interval excludes 0. When only stored figures are at
hand (no rows), :func:`figures_differ` says they differ when their intervals do not overlap: a stricter rule
(two non-overlapping 95 % intervals correspond to p < ~0.006 for equal widths), so it flags fewer drifts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recall_tasks.analysis.aggregates import too_few_rows
from recall_tasks.analysis.resampling import FIGURES, RowTable, bootstrap, interval, kappa_rows, spearman_rows

__all__ = [
    "FIGURES",
    "Agreement",
    "Confusion",
    "Difference",
    "Figure",
    "PairedRow",
    "agreement",
    "by_category",
    "cohen_kappa",
    "compare",
    "figures_differ",
    "interval_note",
    "spearman",
]

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class PairedRow:
    """One labelled row: human and judge verdicts per unit (same order, ``True`` = supported), and scores.

    ``human_score``/``judge_score`` default to the share of supported units when the row has units; a row
    labelled only with an expected score gives ``human`` and ``judge`` empty and both scores.
    ``key`` (e.g. the row id) lets :func:`compare` pair the rows of two agreements.
    """

    human: Sequence[bool]
    judge: Sequence[bool]
    category: str | None = None
    human_score: float | None = None
    judge_score: float | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if len(self.human) != len(self.judge):
            raise ValueError(f"row {self.key or ''}: {len(self.human)} human verdicts but {len(self.judge)} judge's")

    def scores(self) -> tuple[float | None, float | None]:
        """(human, judge) row scores, computed from the units when not given."""
        h = self.human_score if self.human_score is not None else _share(self.human)
        j = self.judge_score if self.judge_score is not None else _share(self.judge)
        return h, j


def _share(units: Sequence[bool]) -> float | None:
    return sum(map(bool, units)) / len(units) if units else None


@dataclass(frozen=True)
class Confusion:
    """Unit counts; rows are the human verdict, columns the judge's (positive = supported)."""

    tp: int  # human supported, judge supported
    fn: int  # human supported, judge unsupported
    fp: int  # human unsupported, judge supported
    tn: int  # human unsupported, judge unsupported

    @property
    def units(self) -> int:
        return self.tp + self.fn + self.fp + self.tn


@dataclass(frozen=True)
class Figure:
    """One agreement figure: its value and bootstrap interval, or ``None`` with the reason (the value's when
    ``value`` is None, else the interval's: too few rows)."""

    name: str
    value: float | None
    low: float | None = None
    high: float | None = None
    reason: str | None = None
    undefined_share: float = 0.0  # share of bootstrap replicates where the figure was undefined

    def contains(self, x: float, tol: float = 1e-12) -> bool:
        """Whether ``x`` lies within the interval (False when there is none)."""
        return self.low is not None and self.high is not None and self.low - tol <= x <= self.high + tol


@dataclass(frozen=True)
class Agreement:
    """Every figure of one judge against the labels, with the counts they come from."""

    rows: int
    units: int
    confusion: Confusion
    accuracy: Figure
    kappa: Figure
    tpr: Figure
    tnr: Figure
    mae: Figure
    spearman: Figure
    score_rows: int = 0  # rows with both a human and a judge score (MAE and Spearman use these)
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    confidence: float = 0.95

    def figures(self) -> dict[str, Figure]:
        """The figures by name, in :data:`FIGURES` order."""
        return {name: getattr(self, name) for name in FIGURES}


@dataclass(frozen=True)
class Difference:
    """b - a for one figure, with the bootstrap interval of the difference; ``differs`` when it excludes 0."""

    name: str
    a: float | None
    b: float | None
    delta: float | None
    low: float | None
    high: float | None
    differs: bool
    paired: bool
    reason: str | None = None


# ------------------------------------------------------------------------------------------ point figures


def cohen_kappa(c: Confusion) -> tuple[float | None, str | None]:
    """Cohen's κ of a 2x2 table, or ``(None, reason)`` (see the module docstring)."""
    n = c.units
    if n == 0:
        return None, "no units"
    value = kappa_rows(np.array([[c.tp, c.fn, c.fp, c.tn]], dtype=np.float64))[0]
    if np.isnan(value):
        cls = "supported" if c.tp + c.fn else "unsupported"
        return None, f"undefined: every human label is {cls} (kappa needs both classes)"
    return float(value), None


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float | None, str | None]:
    """Spearman's ρ (Pearson correlation of average ranks), or ``(None, reason)``."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    value = spearman_rows(a, b, np.ones((1, len(a))))[0]
    if len(a) < 3:
        return None, f"needs at least 3 rows with both scores, has {len(a)}"
    if np.isnan(value):
        return None, "undefined: the human or the judge scores are all equal"
    return float(value), None


def _reasons(c: Confusion, table: RowTable) -> dict[str, str]:
    n_scored = int(table.scored.sum())
    out = {
        "accuracy": "no units",
        "kappa": cohen_kappa(c)[1] or "",
        "tpr": "no unit labelled supported",
        "tnr": "no unit labelled unsupported",
        "mae": "no row with both a human and a judge score",
        "spearman": spearman(table.human[table.scored].tolist(), table.judge[table.scored].tolist())[1] or "",
    }
    if n_scored == 0:
        out["spearman"] = out["mae"]
    return out


def agreement(
    rows: Sequence[PairedRow],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Agreement:
    """Every figure with its bootstrap interval (rows resampled; see the module docstring)."""
    table = RowTable.of(rows)
    total = table.counts.sum(axis=0)
    confusion = Confusion(*(int(v) for v in total))
    point = table.figures(np.ones((1, len(rows))))
    boot = bootstrap([table], None, resamples, seed)[0] if too_few_rows(len(rows)) is None else {}
    reasons = _reasons(confusion, table)
    few = too_few_rows(len(rows))
    figures: dict[str, Figure] = {}
    for name in FIGURES:
        value = float(point[name][0])
        if np.isnan(value):
            figures[name] = Figure(name, None, reason=reasons[name])
            continue
        if few is not None:
            figures[name] = Figure(name, value, reason=few)
            continue
        low, high, undefined = interval(boot[name], confidence)
        figures[name] = Figure(name, value, low, high, undefined_share=undefined)
    return Agreement(
        rows=len(rows),
        units=confusion.units,
        confusion=confusion,
        score_rows=int(table.scored.sum()),
        resamples=resamples,
        seed=seed,
        confidence=confidence,
        **figures,
    )


def interval_note(a: Agreement) -> str | None:
    """Why the defined figures of ``a`` have no interval (too few rows), or None when they have one."""
    return next((f.reason for f in a.figures().values() if f.value is not None and f.low is None and f.reason), None)


def by_category(
    rows: Sequence[PairedRow],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> dict[str, Agreement]:
    """:func:`agreement` per category (rows without one under ``"(none)"``), categories sorted."""
    groups: dict[str, list[PairedRow]] = {}
    for r in rows:
        groups.setdefault(r.category if r.category is not None else "(none)", []).append(r)
    return {
        cat: agreement(groups[cat], resamples=resamples, seed=seed, confidence=confidence) for cat in sorted(groups)
    }


# ------------------------------------------------------------------------------------------ comparison


def _paired(a: Sequence[PairedRow], b: Sequence[PairedRow]) -> list[int] | None:
    """For each row of ``a``, the index of the row of ``b`` with its key; None unless both are the same keys."""
    ka, kb = [r.key for r in a], [r.key for r in b]
    if None in ka or None in kb or len(ka) != len(kb) or len(set(ka)) != len(ka) or set(ka) != set(kb):
        return None
    where = {k: i for i, k in enumerate(kb)}
    return [where[k] for k in ka]


def compare(
    a: Sequence[PairedRow],
    b: Sequence[PairedRow],
    figure: str = "accuracy",
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Difference:
    """Whether ``figure`` moved from ``a`` to ``b`` beyond chance: the bootstrap interval of b - a excludes 0.

    Paired (one resampling of the shared rows, matched by ``PairedRow.key``) when ``a`` and ``b`` hold the same
    keys, e.g. one canary set judged in two runs; otherwise each side is resampled on its own.
    """
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r}; choose {', '.join(FIGURES)}")
    ta, tb = RowTable.of(a), RowTable.of(b)
    pa_ = float(ta.figures(np.ones((1, len(a))))[figure][0])
    pb_ = float(tb.figures(np.ones((1, len(b))))[figure][0])
    va, vb = (None if np.isnan(pa_) else pa_), (None if np.isnan(pb_) else pb_)
    order = _paired(a, b)
    if va is None or vb is None:
        which = "a" if va is None else "b"
        return Difference(figure, va, vb, None, None, None, False, order is not None, f"{figure} undefined in {which}")
    few = too_few_rows(min(len(a), len(b)))
    if few is not None:  # no interval of the difference: never "differs"
        return Difference(figure, va, vb, vb - va, None, None, False, order is not None, few)
    boot_a, boot_b = bootstrap([ta, tb], order, resamples, seed)
    diff = boot_b[figure] - boot_a[figure]
    low, high, _ = interval(diff, confidence)
    differs = low is not None and high is not None and (low > 0 or high < 0)
    return Difference(figure, va, vb, vb - va, low, high, differs, order is not None)


def figures_differ(a: Figure, b: Figure) -> bool:
    """Whether two stored figures' intervals do not overlap (the rule when the rows are not at hand)."""
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return False
    return a.high < b.low or b.high < a.low
