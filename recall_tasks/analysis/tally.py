"""A run's aggregates gathered one batch of rows at a time: the run row's figures, each segment's, the dominant
error and the reply models, without a table of every row.

The commit built a table of every row's summary columns (~100 bytes a row, ~70-100 MB at 1,000,000 rows) to
aggregate it (issue 42 item 3). :class:`RunTally` keeps counters and sums, and each scored row's score as a
float64: the median, the 10th percentile and the bootstrap interval need every score, and they must come out
exactly as from the whole column, so the scores are kept whole, in row order (**8 bytes a scored row**, and 8 more
per segment column). Sums are added batch by batch in row order, as Arrow adds a chunked column's chunks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_COUNTED = ("prompt_tokens", "completion_tokens", "requests")


def _sum(values: Any) -> float | int:
    """A column's sum (nulls skipped), 0 for none."""
    return pc.sum(values).as_py() or 0


class RunTally:
    """Aggregates of a run's rows fed one batch at a time (:meth:`add`); :meth:`stats` gives the run row's figures.

    ``segment_columns``: a tally per value of each (null is its own value), read by :meth:`segments`. A batch
    has the result columns (``score``, ``success``, ``error``, ``skipped``, ``cached``, the
    token, request and cost columns; optionally ``not_judged``, ``context_precision`` with ``chunks_used`` and
    ``context_count``, ``reply_model`` and ``flags``).
    """

    def __init__(self, segment_columns: list[str] | tuple[str, ...] = ()) -> None:
        self.rows = 0
        self._scores: list[np.ndarray] = []
        self._counts = {"errors": 0, "skipped": 0, "not_judged": 0, "cached": 0}
        self._success = [0, 0]  # successes and rows with a success value, among the scored rows
        self._totals: dict[str, float | int] = {name: 0 for name in (*_COUNTED, "cost_usd")}
        self._precision: list[float] | None = None  # sum and count of the scored rows' context precision
        self._use: list[float] = [0.0, 0]  # sum and count of the scored rows' share of chunks used
        self._errors: dict[str, int] = {}  # error text -> rows, in order of first appearance
        self._models: set[str] = set()
        self._substituted = 0
        self._segments: dict[str, dict[Any, RunTally]] = {name: {} for name in segment_columns}

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Count the rows of ``batch`` (and of each segment's part of it)."""
        from recall_tasks.judges.base import SUBSTITUTED_FLAG

        self.rows += batch.num_rows
        names = batch.schema.names
        score = batch.column("score")
        scored = pc.is_valid(score)
        self._scores.append(pc.filter(score, scored).to_numpy(zero_copy_only=False).astype(float))
        success = pc.filter(batch.column("success"), scored)
        self._success[0] += int(_sum(pc.cast(success, pa.int64())))
        self._success[1] += len(success) - success.null_count
        errors = batch.column("error")
        self._counts["errors"] += len(errors) - errors.null_count
        self._counts["skipped"] += int(_sum(batch.column("skipped")))
        self._counts["cached"] += int(_sum(batch.column("cached")))
        if "not_judged" in names:
            self._counts["not_judged"] += int(_sum(batch.column("not_judged")))
        for name in self._totals:
            self._totals[name] += _sum(batch.column(name))
        if "context_precision" in names:
            self._add_chunk_figures(batch, scored)
        if errors.null_count < len(errors):
            for item in pc.value_counts(errors.drop_null()).to_pylist():
                self._errors[item["values"]] = self._errors.get(item["values"], 0) + item["counts"]
        if "reply_model" in names:
            self._models.update(m for m in pc.unique(batch.column("reply_model")).to_pylist() if m is not None)
        if "flags" in names:
            flags = pc.list_flatten(batch.column("flags"))
            self._substituted += int(_sum(pc.starts_with(flags, SUBSTITUTED_FLAG))) if len(flags) else 0
        for name, tallies in self._segments.items():
            values = batch.column(name)
            for value in pc.unique(values).to_pylist():
                mask = pc.is_null(values) if value is None else pc.fill_null(pc.equal(values, value), False)
                tallies.setdefault(value, RunTally()).add(batch.filter(mask))

    def _add_chunk_figures(self, batch: pa.RecordBatch | pa.Table, scored: Any) -> None:
        precision = pc.filter(batch.column("context_precision"), scored)
        used = pc.cast(pc.filter(batch.column("chunks_used"), scored), pa.float64())
        retrieved = pc.cast(pc.filter(batch.column("context_count"), scored), pa.float64())
        rate = pc.divide(used, pc.if_else(pc.greater(retrieved, 0), retrieved, None))
        if self._precision is None:
            self._precision = [0.0, 0]
        self._precision[0] += _sum(precision)
        self._precision[1] += len(precision) - precision.null_count
        self._use[0] += _sum(rate)
        self._use[1] += len(rate) - rate.null_count

    def scores(self) -> np.ndarray:
        """The scored rows' scores in row order (float64)."""
        return np.concatenate(self._scores) if self._scores else np.empty(0)

    def stats(self) -> dict[str, Any]:
        """The run row's figures of the rows added (counts, score mean/median/p10 and interval, tokens, cost)."""
        from recall_tasks.analysis.aggregates import mean_ci

        scores = self.scores()
        scored = len(scores)
        lo, hi = mean_ci(scores)
        not_judged = self._counts["not_judged"]
        hits, judged = self._success
        precision = self._precision
        return {
            "rows": self.rows,
            "scored": scored,
            "errors": self._counts["errors"],
            "skipped": self._counts["skipped"] - not_judged,
            "not_judged": not_judged,
            "cached": self._counts["cached"],
            "mean_score": float(scores.mean()) if scored else None,
            "median_score": float(np.median(scores)) if scored else None,
            "p10_score": float(np.percentile(scores, 10)) if scored else None,
            "ci_low": lo,
            "ci_high": hi,
            "pass_rate": hits / judged if scored and judged else None,
            **{name: int(self._totals[name]) for name in _COUNTED},
            "cost_usd": float(self._totals["cost_usd"]),
            "mean_context_precision": precision[0] / precision[1] if precision and precision[1] else None,
            "chunk_use_rate": self._use[0] / self._use[1] if precision and self._use[1] else None,
        }

    def dominant_error(self) -> tuple[str | None, int]:
        """The most frequent error text and its rows (the first to appear among equals); ``(None, 0)`` for none."""
        if not self._errors:
            return None, 0
        text = max(self._errors, key=lambda key: self._errors[key])
        return str(text), self._errors[text]

    def replied(self) -> dict[str, Any]:
        """``reply_models`` (the models the replies named, sorted) and ``substituted_rows`` (rows a reply from
        another model than the one asked for judged: their flag says so)."""
        return {"reply_models": sorted(self._models), "substituted_rows": self._substituted}

    def segments(self, column: str) -> list[tuple[str | None, dict[str, Any]]]:
        """One aggregate per value of ``column`` (named ``str(value)``; null is its own segment, last)."""
        out = [(None if v is None else str(v), tally.stats()) for v, tally in self._segments[column].items()]
        out.sort(key=lambda item: (item[0] is None, item[0] or ""))
        return out
