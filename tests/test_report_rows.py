"""The report's rows of a run (``reports/run_data.bounded_results``): all rows light, text for the worst only."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads

from recall_tasks.reports.run_data import bounded_results

RUN = "20261204T150000Z-abcdef"
SOURCE = "s3://a-bucket/evaluations/golden-sets/2026-12-04/part-00000.parquet"


def _results(rows: int) -> pads.Dataset:
    """Two runs' result rows (the other run's rows come first), the run's lowest scores at rows 7 and 4,001."""
    scores = [0.9] * rows
    scores[7], scores[4001] = 0.1, 0.2
    mine = {
        "run_id": [RUN] * rows, "row_id": [f"q{i:07d}" for i in range(rows)],
        "input": [f"question {i}" for i in range(rows)],
        "score": scores, "success": [s >= 0.5 for s in scores], "error": pa.nulls(rows, pa.string()),
        "skipped": [False] * rows, "cached": [False] * rows, "verdicts": [f"verdicts {i}" for i in range(rows)],
        "reason": [f"reason {i}" for i in range(rows)], "source_file": [SOURCE] * rows, "source_row": list(range(rows)),
        "content_hash": [f"{i:024x}" for i in range(rows)],
    }  # fmt: skip
    table = pa.table(mine)
    other = table.slice(0, 100).set_column(0, "run_id", pa.array(["other"] * 100))
    return pads.dataset(pa.concat_tables([other, table]))


def test_the_worst_rows_get_their_text_and_the_others_none():
    table = bounded_results(_results(5000), RUN, keep=2)
    assert table.num_rows == 5000
    columns = [table.column(c).to_pylist() for c in ("row_id", "input", "reason")]
    text = {rid: (q, r) for rid, q, r in zip(*columns, strict=True) if q is not None}
    assert text == {"q0000007": ("question 7", "reason 7"), "q0004001": ("question 4001", "reason 4001")}
    assert table.column("source_file").to_pylist()[:2] == [SOURCE, SOURCE]


def test_a_row_costs_its_own_columns_not_the_run_id_and_path_again():
    """A light row holds no copy of the run id or the source path: ~65 bytes here (158 with them)."""
    table = bounded_results(_results(5000), RUN, keep=2)
    light = table.drop_columns(["input", "verdicts", "reason"])
    assert "run_id" not in table.column_names
    assert light.nbytes / table.num_rows < 75, light.nbytes / table.num_rows
