"""A run's aggregates gathered batch by batch (``analysis/tally.py``), as the commit gathers them.

Against figures computed here from plain Python lists of the same rows: the median, the 10th percentile, the mean
and its interval exactly; and what the tally holds grows by at most 12 bytes a scored row (its scores: 8).
"""

from __future__ import annotations

import random
import statistics
import tracemalloc
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from recall_tasks.analysis.aggregates import mean_ci
from recall_tasks.analysis.tally import RunTally
from recall_tasks.judges.base import SUBSTITUTED_FLAG

ERRORS = ["judge timed out", "bad reply", "judge timed out", "bad reply", "missing context"]


def _rows(n: int, seed: int = 1) -> list[dict]:
    """Rows of every kind: scored, errored, skipped, not judged, cached; segments with a null value."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = rng.random()
        scored = kind < 0.8
        rows.append({
            "score": round(rng.random(), 3) if scored else None,
            "success": (rng.random() < 0.7 if i % 13 else None) if scored else None,
            "error": ERRORS[i % len(ERRORS)] if 0.8 <= kind < 0.85 else None,
            "skipped": kind >= 0.85,
            "not_judged": kind >= 0.93,
            "cached": rng.random() < 0.3,
            "prompt_tokens": rng.randrange(500), "completion_tokens": rng.randrange(50), "requests": 1,
            "cost_usd": rng.random() / 1000,
            "context_precision": rng.random() if scored and i % 7 else None,
            "chunks_used": rng.randrange(4), "context_count": rng.randrange(4),
            "reply_model": ["gpt-4o-mini", "gpt-4o", None][i % 3],
            "flags": [f"{SUBSTITUTED_FLAG}: gpt-4o"] if i % 11 == 0 else [],
            "topic": [None, "billing", "setup", "returns"][i % 4] if i < n - 5 else "late",
        })  # fmt: skip
    return rows


def _tally(rows: list[dict], sizes: list[int]) -> RunTally:
    tally = RunTally(["topic"])
    table = pa.Table.from_pylist(rows)
    start = 0
    for size in sizes:
        tally.add(table.slice(start, size).to_batches()[0] if size else table.slice(start, 0))
        start += size
    assert start == len(rows)
    return tally


def _expected(rows: list[dict]) -> dict:
    """The run row's figures of ``rows`` computed from Python lists."""
    scored = [r for r in rows if r["score"] is not None]
    scores = [r["score"] for r in scored]
    success = [r["success"] for r in scored if r["success"] is not None]
    precision = [r["context_precision"] for r in scored if r["context_precision"] is not None]
    use = [r["chunks_used"] / r["context_count"] for r in scored if r["context_count"]]
    not_judged = sum(r["not_judged"] for r in rows)
    lo, hi = mean_ci(np.array(scores))
    return {
        "rows": len(rows), "scored": len(scores), "errors": sum(r["error"] is not None for r in rows),
        "skipped": sum(r["skipped"] for r in rows) - not_judged, "not_judged": not_judged,
        "cached": sum(r["cached"] for r in rows),
        "mean_score": float(np.mean(scores)), "median_score": statistics.median(scores),
        "p10_score": float(np.percentile(scores, 10)), "ci_low": lo, "ci_high": hi,
        "pass_rate": sum(success) / len(success),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "completion_tokens": sum(r["completion_tokens"] for r in rows), "requests": len(rows),
        "cost_usd": pytest.approx(sum(r["cost_usd"] for r in rows), rel=1e-12),
        "mean_context_precision": pytest.approx(statistics.fmean(precision), rel=1e-12),
        "chunk_use_rate": pytest.approx(statistics.fmean(use), rel=1e-12),
    }  # fmt: skip


@pytest.mark.parametrize("sizes", [[3000], [1000, 0, 999, 1001], [1] * 10 + [2990]])
def test_the_figures_of_the_rows_whatever_the_batches(sizes):
    """Bootstrap interval (3,000 scored rows or fewer) included: the scores are kept whole and in row order."""
    rows = _rows(3000)
    tally = _tally(rows, sizes)
    assert tally.stats() == _expected(rows)
    assert tally.dominant_error() == Counter(r["error"] for r in rows if r["error"]).most_common(1)[0]
    assert tally.replied() == {
        "reply_models": ["gpt-4o", "gpt-4o-mini"], "substituted_rows": sum(bool(r["flags"]) for r in rows),
    }  # fmt: skip
    segments = tally.segments("topic")
    assert [name for name, _ in segments] == ["billing", "late", "returns", "setup", None]
    for name, stats in segments:
        assert stats == _expected([r for r in rows if r["topic"] == name]), name


def test_the_first_error_wins_a_tie_and_no_rows_give_no_figures():
    rows = _rows(40)
    for i, row in enumerate(rows):
        row["error"] = ["b", "a"][i % 2] if i < 4 else None
    assert _tally(rows, [3, 37]).dominant_error() == ("b", 2)
    empty = RunTally(["topic"])
    assert empty.stats()["rows"] == 0 and empty.stats()["median_score"] is None and empty.stats()["ci_low"] is None
    assert empty.dominant_error() == (None, 0) and empty.segments("topic") == []
    assert empty.replied() == {"reply_models": [], "substituted_rows": 0}


def _held(n: int, batch: pa.RecordBatch) -> int:
    """Bytes a tally of ``n`` rows holds once fed (``tracemalloc``: the scores are NumPy's, traced)."""
    tracemalloc.start()
    try:
        tally = RunTally()
        for _ in range(n // batch.num_rows):
            tally.add(batch)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_a_tally_holds_at_most_12_bytes_a_scored_row():
    """200,000 rows more cost at most 12 bytes each (their scores: 8); the table the commit built was ~100."""
    rows = [{**row, "score": 0.5, "error": None} for row in _rows(2000)]
    batch = pa.Table.from_pylist(rows).to_batches()[0]
    small, large = _held(100_000, batch), _held(300_000, batch)
    assert (large - small) / 200_000 <= 12, (small, large)


def test_the_commit_holds_one_batch_of_the_run_at_a_time(tmp_path, monkeypatch):
    """Arrow's allocations as the commit reads the run's 20 chunk files to aggregate them stay within a few
    chunks' size: a table of every row's summary columns grew by one chunk per file read."""
    from recall_tasks.config import RunParams
    from recall_tasks.pipeline import commit, steps
    from recall_tasks.pipeline.window import score_chunks
    from tests.test_pipeline import make_rows, write_parquet
    from tests.test_window import PoolExecutor

    data = write_parquet(tmp_path / "data" / "d.parquet", make_rows(2000))
    plan = steps.plan_run(
        RunParams(dataset_uri=data, output_uri=str(tmp_path / "out"), judge="lexical", chunk_size=100, max_workers=2)
    )
    parts = score_chunks(plan, PoolExecutor(plan)).parts
    read_parts = plan.store.read_parts
    held: list[int] = []
    sizes: list[int] = []

    def counted(parts, columns=None):
        for batch in read_parts(parts, columns=columns):
            if columns is not None and "reason" in columns:  # the aggregation's read, not the commit's write
                held.append(pa.total_allocated_bytes())
                sizes.append(batch.nbytes)
            yield batch

    monkeypatch.setattr(plan.store, "read_parts", counted)
    assert commit.commit_run(plan, parts)["rows"] == 2000
    assert len(held) == 20
    assert max(held) - held[0] <= 3 * max(sizes), (held, sizes)
