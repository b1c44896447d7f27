"""The worst rows of a comparison: the paired rows whose score dropped the most, and the statements they lost.

:func:`worst_rows` picks them from the pairs (:mod:`~recall_tasks.analysis.pairing`) with numpy and reads the
verdicts of those rows only; :func:`lost_statements` is also what ``tracking.fill_lost`` uses when the verdicts are
read from the tables afterwards. The rule is in docs/regression.md, "Worst rows".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from recall_tasks.analysis.pairing import Pairs

__all__ = ["WorstRow", "lost_statements", "worst_rows"]


class WorstRow(BaseModel):
    """One of the paired rows whose score dropped the most."""

    row_id: str
    score_baseline: float
    score_current: float
    delta: float
    lost: list[str] = Field(default_factory=list)


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


def worst_rows(pairs: Pairs, worst: int) -> list[WorstRow]:
    """Up to ``worst`` pairs whose score dropped, most negative first (ties: current order), with lost statements."""
    if worst <= 0 or len(pairs.cur_pos) == 0:
        return []
    sc, sb = pairs.score_current, pairs.score_baseline
    deltas = sc - sb
    dropped = np.flatnonzero(deltas < 0)
    if len(dropped) > worst:
        # the `worst` smallest deltas, with every row tied at the cut-off, then a stable full order
        cut = np.partition(deltas[dropped], worst - 1)[worst - 1]
        dropped = dropped[deltas[dropped] <= cut]
    chosen = dropped[np.lexsort((dropped, deltas[dropped]))][:worst]
    take_cur = pa.array(pairs.cur_pos[chosen])
    take_base = pa.array(pairs.base_pos[chosen])
    ids = pairs.row_ids.take(take_cur).to_pylist()
    current, baseline = pairs.current, pairs.baseline
    has_verdicts = "verdicts" in current.column_names and "verdicts" in baseline.column_names
    cur_v = current.column("verdicts").take(take_cur).to_pylist() if has_verdicts else [None] * len(chosen)
    base_v = baseline.column("verdicts").take(take_base).to_pylist() if has_verdicts else [None] * len(chosen)
    return [
        WorstRow(
            row_id=str(ids[k]),
            score_baseline=float(sb[i]),
            score_current=float(sc[i]),
            delta=float(deltas[i]),
            lost=lost_statements(base_v[k], cur_v[k]),
        )
        for k, i in enumerate(chosen)
    ]
