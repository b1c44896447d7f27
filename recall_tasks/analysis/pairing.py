"""Pairing two runs' result rows by ``row_id``: which rows are compared, and their scores side by side.

A pair counts only when the row was scored (not null, not NaN) in both runs; a repeated row id keeps its first
occurrence, with a warning. One hash lookup (``pyarrow.compute.index_in``) of the current row ids in the
baseline's, then numpy gathers. The rule is in docs/regression.md, "Pairing".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Pairs", "pair_rows"]


@dataclass(frozen=True)
class Pairs:
    """The paired rows of two runs' results (arrays aligned: element ``k`` is the ``k``-th pair)."""

    current: pa.Table
    """The current results, one row per row id."""
    baseline: pa.Table
    """The baseline results, one row per row id."""
    row_ids: pa.Array
    """Row ids of ``current`` (large strings)."""
    n_matched: int
    """Rows of ``current`` whose row id is in ``baseline`` (scored or not)."""
    cur_pos: np.ndarray
    """Position of each pair in ``current``."""
    base_pos: np.ndarray
    """Position of each pair in ``baseline``."""
    score_current: np.ndarray
    score_baseline: np.ndarray
    success_current: np.ndarray
    success_baseline: np.ndarray
    known: np.ndarray
    """Pairs with a ``success`` value in both runs (the ones the flips count)."""

    def mean_delta_of(self, column: str) -> float | None:
        """Mean change of a numeric column over the pairs that have it (not null, not NaN) in both runs."""
        if column not in self.current.column_names or column not in self.baseline.column_names:
            return None
        cur = pc.cast(self.current.column(column), pa.float64()).to_numpy(zero_copy_only=False)
        base = pc.cast(self.baseline.column(column), pa.float64()).to_numpy(zero_copy_only=False)
        a, b = np.asarray(cur, float)[self.cur_pos], np.asarray(base, float)[self.base_pos]
        both = ~np.isnan(a) & ~np.isnan(b)
        return float((a[both] - b[both]).mean()) if both.any() else None


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


def pair_rows(current: pa.Table, baseline: pa.Table, warnings: list[str]) -> Pairs:
    """Pair the rows of ``current`` with those of ``baseline`` by ``row_id``; notes go to ``warnings``."""
    current = _first_occurrences(current, "current", warnings)
    baseline = _first_occurrences(baseline, "baseline", warnings)
    cur_ids = pc.cast(current.column("row_id"), pa.large_string()).combine_chunks()
    base_ids = pc.cast(baseline.column("row_id"), pa.large_string()).combine_chunks()

    # position of each current row in the baseline (-1 when absent)
    found = pc.index_in(cur_ids, value_set=base_ids)
    in_base = np.asarray(found.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    base_index = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    cur_score, cur_scored = _scores(current)
    base_score, base_scored = _scores(baseline)
    paired = in_base & cur_scored
    paired[paired] = base_scored[base_index[paired]]
    cur_pos = np.flatnonzero(paired)
    base_pos = base_index[cur_pos]

    cur_succ, cur_known = _successes(current)
    base_succ, base_known = _successes(baseline)
    known = cur_known[cur_pos] & base_known[base_pos]
    if len(cur_pos) and not known.all():
        warnings.append(f"{int(np.count_nonzero(~known))} paired row(s) lack a success value; left out of the flips")
    return Pairs(
        current=current,
        baseline=baseline,
        row_ids=cur_ids,
        n_matched=int(np.count_nonzero(in_base)),
        cur_pos=cur_pos,
        base_pos=base_pos,
        score_current=cur_score[cur_pos],
        score_baseline=base_score[base_pos],
        success_current=cur_succ[cur_pos],
        success_baseline=base_succ[base_pos],
        known=known,
    )
