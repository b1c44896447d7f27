"""The report's rows of a run (``reports/run_data.bounded_results``): all rows light, text for the worst only."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from recall_tasks.reports.run_data import bounded_results

RUN = "20261204T150000Z-abcdef"
SOURCE = "s3://a-bucket/evaluations/golden-sets/2026-12-04/part-00000.parquet"


def _results(rows: int, folder=None) -> pads.Dataset:
    """Two runs' result rows (the other run's rows come first), the run's lowest scores at rows 7 and 4,001; in
    memory, or in ``folder`` as Parquet files of 1,500-row row groups (the worst rows' text is then read file by
    file, a batch at a time)."""
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
    both = pa.concat_tables([other, table])
    if folder is None:
        return pads.dataset(both)
    pq.write_table(both.slice(0, 3000), folder / "part-0.parquet", row_group_size=1500)
    pq.write_table(both.slice(3000), folder / "part-1.parquet", row_group_size=1500)
    return pads.dataset(str(folder), format="parquet")


@pytest.mark.parametrize("where", ["memory", "files"])
def test_the_worst_rows_get_their_text_and_the_others_none(where, tmp_path):
    table = bounded_results(_results(5000, tmp_path if where == "files" else None), RUN, keep=2)
    assert table.num_rows == 5000
    columns = [table.column(c).to_pylist() for c in ("row_id", "input", "reason")]
    text = {rid: (q, r) for rid, q, r in zip(*columns, strict=True) if q is not None}
    assert text == {"q0000007": ("question 7", "reason 7"), "q0004001": ("question 4001", "reason 4001")}
    assert table.column("source_file").to_pylist()[:2] == [SOURCE, SOURCE]
    hashes = {rid: h for rid, h in zip(columns[0], table.column("content_hash").to_pylist(), strict=True) if h}
    assert hashes == {"q0000007": f"{7:024x}", "q0004001": f"{4001:024x}"}  # only the worst rows' chunks are read


def test_a_row_costs_its_own_columns_not_the_run_id_and_path_again():
    """A light row holds no copy of the run id or the source path, and no content hash: ~37 bytes here (158 with
    the run id and path, 65 with the hash)."""
    table = bounded_results(_results(5000), RUN, keep=2)
    light = table.drop_columns(["input", "verdicts", "reason", "content_hash"])
    assert "run_id" not in table.column_names
    assert light.nbytes / table.num_rows < 45, light.nbytes / table.num_rows
