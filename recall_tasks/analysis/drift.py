"""Judge drift: whether two runs' canaries (``--canary``) say their judge agreed with the labels differently.

A run with a canary records, on its overall ``runs`` row, the judge's agreement with a small labelled set
(``canary_*`` columns, ``io/schemas.CANARY_FIELDS``) and the per-row unit counts behind it (``canary_detail``).
Two runs' scores are comparable only when their judges answered alike: a comparison whose canary agreement moved
beyond its interval is ``incomparable`` with the reason "judge drift: ..." (never ``regressed`` or ``improved``).

The rule (docs/regression.md, "The canary"): both runs judged the same labelled set (equal ``canary_id``); the
canary rows judged in both runs are paired by key and resampled together (``agreement.compare``, a paired
bootstrap: the same canary rows in both runs); the judge drifted when the 95 % interval of the change in unit
accuracy or in Cohen's κ excludes 0. Runs recorded without the per-row counts fall back to the stored intervals
(``agreement.figures_differ``: drift when they do not overlap, a stricter rule). A canary absent on one side, or two
different labelled sets, or a canary of fewer rows than an interval needs (``MIN_INTERVAL_ROWS``), is said in the
comparison's warnings (:func:`canary_note`) and changes nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recall_tasks.analysis.aggregates import too_few_rows
from recall_tasks.analysis.agreement import Figure, PairedRow, compare, figures_differ

__all__ = ["DRIFT_FIGURES", "DRIFT_REASON", "Drift", "canary_figures", "canary_note", "judge_drift"]

#: How the reason of a drifted comparison starts (``incomparable: judge drift``).
DRIFT_REASON = "judge drift: "

#: The agreement figures whose move makes a judge drift, in the order they are named.
DRIFT_FIGURES = ("accuracy", "kappa")


@dataclass(frozen=True)
class Moved:
    """One figure of the canary in both runs, and the interval of its change."""

    name: str
    baseline: float | None
    current: float | None
    delta: float | None
    low: float | None
    high: float | None
    differs: bool


@dataclass(frozen=True)
class Drift:
    """The canary figures of two runs judged on the same labelled set, and which moved beyond their interval."""

    canary_id: str
    figures: list[Moved]
    paired_rows: int
    paired: bool  # per-row counts on both sides (a paired bootstrap), else the stored intervals

    @property
    def drifted(self) -> bool:
        return any(m.differs for m in self.figures)

    def reason(self) -> str:
        """``judge drift: canary accuracy 0.950 (95 % CI 0.93..0.97) -> 0.800 (0.76..0.84), change -0.150
        (95 % CI -0.19..-0.11) over 40 paired rows; ...``: the figures that moved."""
        parts = [_moved_text(m) for m in self.figures if m.differs]
        how = f"over {self.paired_rows} paired canary rows" if self.paired else "stored intervals do not overlap"
        return f"{DRIFT_REASON}{'; '.join(parts)} ({how})"

    def payload(self, current: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
        """JSON-safe figures for the comparison's event payload and alert."""
        return {
            "canary_id": self.canary_id,
            "drifted": self.drifted,
            "paired": self.paired,
            "paired_rows": self.paired_rows,
            "current": canary_figures(current),
            "baseline": canary_figures(baseline),
            "changes": [m.__dict__ for m in self.figures],
        }


def _num(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _moved_text(m: Moved) -> str:
    return (
        f"canary {m.name} {_num(m.baseline)} -> {_num(m.current)}, change {_num(m.delta, '+.3f')} "
        f"(95 % CI {_num(m.low, '+.3f')}..{_num(m.high, '+.3f')})"
    )


def canary_figures(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """A run's recorded canary figures (None when it had no canary)."""
    if not run.get("canary_id"):
        return None
    keys = ("canary_id", "canary_rows", "canary_units", "canary_cached", "canary_errors", "canary_tpr", "canary_tnr")
    out = {k.removeprefix("canary_"): run.get(k) for k in keys}
    for name in DRIFT_FIGURES:
        out[name] = [run.get(f"canary_{name}"), run.get(f"canary_{name}_low"), run.get(f"canary_{name}_high")]
    return out


def canary_note(current: Mapping[str, Any], baseline: Mapping[str, Any]) -> str | None:
    """Why judge drift was not checked although one run has a canary (None when checked, or neither has one)."""
    a, b = current.get("canary_id"), baseline.get("canary_id")
    if not a and not b:
        return None
    if not b:
        return "the baseline run has no canary: judge drift not checked"
    if not a:
        return "this run has no canary (the baseline has one): judge drift not checked"
    if a != b:
        return f"the runs' canaries are different labelled sets ({a} vs {b}): judge drift not checked"
    for side, run in (("this run's", current), ("the baseline's", baseline)):
        if not run.get("canary_rows") and run.get("canary_accuracy") is None:
            errors = run.get("canary_errors")
            return f"{side} canary got no verdict ({errors} rows without one): judge drift not checked"
    for side, run in (("this run's", current), ("the baseline's", baseline)):
        few = too_few_rows(int(run.get("canary_rows") or 0)) if run.get("canary_rows") is not None else None
        if few is not None:
            return f"{side} canary: {few}; judge drift not checked"
    return None


def _rows(detail: Sequence[Mapping[str, Any]] | None) -> dict[str, PairedRow]:
    """Per-row unit counts back to paired verdicts (the order of units in a row changes no figure)."""
    out = {}
    for d in detail or []:
        tp, fn, fp, tn = (int(d.get(k) or 0) for k in ("tp", "fn", "fp", "tn"))
        human = [True] * (tp + fn) + [False] * (fp + tn)
        judge = [True] * tp + [False] * fn + [True] * fp + [False] * tn
        out[str(d["key"])] = PairedRow(human, judge, key=str(d["key"]))
    return out


def _stored(run: Mapping[str, Any], name: str) -> Figure:
    return Figure(name, run.get(f"canary_{name}"), run.get(f"canary_{name}_low"), run.get(f"canary_{name}_high"))


def judge_drift(current: Mapping[str, Any], baseline: Mapping[str, Any]) -> Drift | None:
    """The canary figures of both runs and which moved (None unless both judged the same labelled set)."""
    canary_id = current.get("canary_id")
    if not canary_id or canary_id != baseline.get("canary_id"):
        return None
    now, before = _rows(current.get("canary_detail")), _rows(baseline.get("canary_detail"))
    shared = [k for k in before if k in now]
    figures = []
    if shared:
        a, b = [before[k] for k in shared], [now[k] for k in shared]
        for name in DRIFT_FIGURES:
            d = compare(a, b, name)
            figures.append(Moved(name, d.a, d.b, d.delta, d.low, d.high, d.differs))
        return Drift(str(canary_id), figures, len(shared), True)
    for name in DRIFT_FIGURES:
        fa, fb = _stored(baseline, name), _stored(current, name)
        delta = None if fa.value is None or fb.value is None else fb.value - fa.value
        figures.append(Moved(name, fa.value, fb.value, delta, None, None, figures_differ(fa, fb)))
    return Drift(str(canary_id), figures, 0, False)
