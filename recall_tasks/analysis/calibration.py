"""A calibration's data: each judge's verdicts on a labelled set paired with the human labels, and the figures.

Built by :mod:`recall_tasks.pipeline.calibrate` (``recall-bench calibrate``), rendered by
:mod:`recall_tasks.reports.calibration`, stored as the ``calibrations`` table (``io/schemas.CALIBRATION_SCHEMA``).

What is paired (:func:`pair_outcomes`): per labelled row, the human labels and the judge's verdicts of the same
units (``yes`` = supported); a row the judge gave no verdict for (an error, a row left unjudged by the budget or
an outage) is left out of the figures and counted in ``row_errors``, and the judge's status is then ``failed``:
figures from part of the set are not the set's figures.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from recall_tasks.analysis.agreement import Agreement, PairedRow, interval_note
from recall_tasks.io.labels import LabelledRow, LabelledSet
from recall_tasks.models import RecallResult

__all__ = [
    "Calibration",
    "Disagreement",
    "JudgeCalibration",
    "JudgeSpec",
    "new_calibration_id",
    "pair_outcomes",
]


class Outcome(Protocol):
    """What scoring gives for one row (``pipeline.scoring.RowOutcome``): a result, or an error."""

    @property
    def result(self) -> RecallResult | None: ...

    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class JudgeSpec:
    """One judge of a calibration: ``lexical``, or ``openai`` with a model."""

    judge: Literal["lexical", "openai"]
    model: str

    @property
    def name(self) -> str:
        return "lexical" if self.judge == "lexical" else f"openai:{self.model}"


@dataclass(frozen=True)
class Disagreement:
    """One unit where the judge's verdict differs from the human label, with the judge's reason."""

    row_key: str
    category: str | None
    task: str
    unit: str
    human: bool
    judge: bool
    reason: str


@dataclass
class JudgeCalibration:
    """One judge's verdicts on the set and its agreement with the labels, overall and by task and category."""

    spec: JudgeSpec
    judge_model: str
    prompt_version: str
    judge_config: str
    rows: int
    paired: list[PairedRow]
    overall: Agreement
    by_task: dict[str, Agreement]
    by_category: dict[str, Agreement]
    disagreements: list[Disagreement]
    row_errors: list[tuple[str, str]]  # (row key, error) of the rows left out
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    cached: int = 0

    @property
    def status(self) -> str:
        return "failed" if self.row_errors else "completed"


@dataclass
class Calibration:
    """Everything ``calibrate`` found: the set, and each judge's calibration."""

    calibration_id: str
    calibrated_at: dt.datetime
    labelled: LabelledSet
    judges: list[JudgeCalibration] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(j.status == "failed" for j in self.judges)

    def table_rows(self) -> list[dict[str, Any]]:
        """The ``calibrations`` table's rows (``io/schemas.CALIBRATION_SCHEMA``): per judge, overall then by task
        (sets mixing both tasks) then by category."""
        from importlib.metadata import version

        tasks = self.labelled.tasks()
        rows: list[dict[str, Any]] = []
        for j in self.judges:
            base = {
                "calibration_id": self.calibration_id, "calibrated_at": self.calibrated_at,
                "dataset": self.labelled.name, "labels_uri": self.labelled.uri,
                "labels_fingerprint": self.labelled.fingerprint, "judge": j.spec.name, "judge_model": j.judge_model,
                "prompt_version": j.prompt_version, "judge_config": j.judge_config, "status": j.status,
                "recall_bench_version": version("recall-bench"),
            }  # fmt: skip
            scopes: list[tuple[str | None, str | None, str, Agreement, list[PairedRow]]] = [
                (None, None, "+".join(tasks), j.overall, j.paired)
            ]
            if len(tasks) > 1:
                scopes += [("task", t, t, a, []) for t, a in j.by_task.items()]
            scopes += [("category", c, "+".join(tasks), a, []) for c, a in j.by_category.items()]
            for column, value, metric, agr, _ in scopes:
                overall = column is None
                row = {
                    **base, "metric": metric, "segment_column": column, "segment_value": value,
                    "rows": (j.rows if overall else agr.rows), "judged_rows": agr.rows,
                    "errors": len(j.row_errors) if overall else None, "units": agr.units,
                    "tp": agr.confusion.tp, "fn": agr.confusion.fn, "fp": agr.confusion.fp, "tn": agr.confusion.tn,
                    "undefined": "; ".join(
                        [f"{f.name}: {f.reason}" for f in agr.figures().values() if f.value is None]
                        + [f"intervals: {note}" for note in [interval_note(agr)] if note]
                    ) or None,
                    "resamples": agr.resamples, "seed": agr.seed,
                    "requests": j.requests if overall else None,
                    "prompt_tokens": j.prompt_tokens if overall else None,
                    "completion_tokens": j.completion_tokens if overall else None,
                    "cost_usd": j.cost_usd if overall else None, "cached": j.cached if overall else None,
                    "disagreements": [d.__dict__ for d in j.disagreements] if overall else [],
                }  # fmt: skip
                for name, fig in agr.figures().items():
                    row[name], row[f"{name}_low"], row[f"{name}_high"] = fig.value, fig.low, fig.high
                rows.append(row)
        return rows


def new_calibration_id(now: dt.datetime) -> str:
    return f"cal-{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def pair_outcomes(
    rows: Sequence[LabelledRow], outcomes: Sequence[Outcome]
) -> tuple[list[PairedRow], list[Disagreement], list[tuple[str, str]]]:
    """Human labels against the judge's verdicts, row by row: (paired rows, disagreements, rows left out)."""
    paired: list[PairedRow] = []
    disagreements: list[Disagreement] = []
    left_out: list[tuple[str, str]] = []
    for row, out in zip(rows, outcomes, strict=True):
        result = out.result
        if result is None or not result.verdicts:
            why = out.error or (result.reason if result is not None else None) or "no verdict"
            left_out.append((row.key, why))
            continue
        units = row.units or []
        if len(result.verdicts) != len(units):
            left_out.append((row.key, f"{len(result.verdicts)} verdicts for {len(units)} labelled units"))
            continue
        said = [v.verdict == "yes" for v in result.verdicts]
        if row.labels is None:
            paired.append(PairedRow([], [], row.category, row.expected_score, sum(said) / len(said), row.key))
            continue
        paired.append(PairedRow(row.labels, said, row.category, row.expected_score, None, row.key))
        for unit, human, judged, v in zip(units, row.labels, said, result.verdicts, strict=True):
            if human != judged:
                disagreements.append(Disagreement(row.key, row.category, row.task, unit, human, judged, v.reason))
    return paired, disagreements, left_out
