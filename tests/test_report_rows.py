"""The report's rows of a run (``reports/run_data.bounded_results``): all rows light, text for the worst only."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from recall_tasks.reports.run_data import _groups_with, _placed, bounded_results

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


@pytest.mark.concurrency
def test_the_worst_rows_text_is_placed_without_reserving_a_reason_for_every_row(tmp_path):
    """Arrow's take of a string column reserves the mean length for every row of its result, nulls included: the
    worst rows' 50 reasons placed over 200,000 rows would reserve ~40 MB here. Measured in a fresh process: the
    pool's peak while ``bounded_results`` runs stays within a few MB of what the table holds."""
    n = 200_000
    reason = "the context lacks a sentence of the expected answer " * 4
    table = pa.table({
        "run_id": [RUN] * n, "row_id": [f"q{i:07d}" for i in range(n)], "score": [0.9] * n,
        "error": pa.nulls(n, pa.string()), "reason": [f"{i:07d} {reason}" for i in range(n)],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=65_536)
    script = f"""
import pyarrow as pa, pyarrow.dataset as pads
from recall_tasks.reports.run_data import _groups_with, _placed, bounded_results
out = bounded_results(pads.dataset("{tmp_path}", format="parquet"), "{RUN}")
print(out.num_rows, out.column("reason").null_count, pa.default_memory_pool().max_memory(), out.nbytes)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    rows, nulls, peak, held = (int(x) for x in done.stdout.split())
    assert (rows, nulls) == (200_000, 200_000 - 50)
    assert peak < held + 16 * 2**20, (peak, held)


@pytest.mark.parametrize(
    "index",
    [[None, 1, None, None, 0], [0, 1, 2], [None, None], [2, None, 1, None], [None, 0, 2, 1, None, None, 0], []],
)
def test_placing_the_worst_rows_values_is_a_take(index):
    values = pa.array([[{"statement": "a", "verdict": "yes"}], None, [{"statement": "c", "verdict": "no"}]])
    at = pa.array(index, pa.int32())
    assert _placed(values, at).to_pylist() == values.take(at).to_pylist()
    texts = pa.array(["x", "y", "z"])
    assert _placed(texts, at).equals(texts.take(at))


def test_a_file_of_many_runs_is_read_only_in_the_row_groups_of_the_run(tmp_path):
    """A file ``maintain`` compacted holds many runs: the row groups whose run_id statistics exclude the run are
    skipped, found by the run_id column's leaf (a nested column before it has leaves of its own)."""
    runs = ["20261201T000000Z-aaaaaa", RUN, "20261207T000000Z-zzzzzz"]
    table = pa.table({
        "verdicts": [[{"statement": f"s{i}", "verdict": "yes"}] for i in range(3000)],
        "run_id": [r for r in runs for _ in range(1000)], "row_id": [f"q{i:07d}" for i in range(3000)],
        "score": [0.5] * 3000, "error": pa.nulls(3000, pa.string()),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "compacted.parquet", row_group_size=500)
    assert _groups_with(pq.ParquetFile(tmp_path / "compacted.parquet").metadata, RUN) == [2, 3]
    out = bounded_results(pads.dataset(str(tmp_path), format="parquet"), RUN, keep=3)
    assert out.column("row_id").to_pylist() == [f"q{i:07d}" for i in range(1000, 2000)]
    assert out.column("verdicts").drop_null().to_pylist() == [
        [{"statement": f"s{i}", "verdict": "yes"}] for i in (1000, 1001, 1002)
    ]
