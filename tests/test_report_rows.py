"""The report's rows of a run (``reports/run_data.bounded_results``): every row's score and figures, whole rows for
the worst only, folded a batch at a time."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from recall_tasks.reports.run_data import LIGHT_BATCH_ROWS, RunRows, _groups_with, bounded_results

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
def test_the_worst_rows_get_their_text_and_every_row_its_score(where, tmp_path):
    rows = bounded_results(_results(5000, tmp_path if where == "files" else None), RUN, keep=2)
    assert rows.num_rows == 5000 and sorted(rows.scores)[:3] == [0.1, 0.2, 0.9]
    worst = rows.worst.to_pydict()
    assert worst["row_id"] == ["q0000007", "q0004001"]
    assert (worst["input"], worst["reason"]) == (["question 7", "question 4001"], ["reason 7", "reason 4001"])
    assert worst["content_hash"] == [f"{7:024x}", f"{4001:024x}"]  # only the worst rows' chunks are read
    assert worst["source_file"] == [SOURCE, SOURCE]
    assert rows.figures == {
        "rows": 5000, "scored": 5000, "errors": 0, "skipped": 0, "cached": 0,
        "mean_score": pytest.approx((0.9 * 4998 + 0.3) / 5000), "pass_rate": 4998 / 5000,
    }  # fmt: skip
    assert "run_id" not in rows.columns and "input" in rows.columns


def test_a_row_costs_its_score_and_nothing_else():
    """Whatever the run's size, the rows kept whole are the worst ``keep`` and the ``wanted`` ones."""
    rows = bounded_results(_results(5000), RUN, keep=2, wanted=["q0000100", "q0004999", "not-a-row"])
    assert rows.scores.nbytes == 8 * 5000
    assert rows.worst.num_rows == 2
    assert rows.wanted.column("row_id").to_pylist() == ["q0000100", "q0004999"]
    assert rows.wanted.column("source_row").to_pylist() == [100, 4999]
    assert "input" not in rows.wanted.column_names  # the light columns only


def test_the_worst_are_picked_across_batches_in_the_reports_order():
    """Errors first, then lowest score, then rows without one; ties in the table's order, across batch ends."""
    n = 3 * LIGHT_BATCH_ROWS
    scores = [0.5] * n
    scores[LIGHT_BATCH_ROWS + 3] = None
    scores[2 * LIGHT_BATCH_ROWS + 1] = 0.25
    errors = [None] * n
    errors[2 * LIGHT_BATCH_ROWS + 7] = errors[5] = "timeout"
    table = pa.table({"row_id": [f"q{i}" for i in range(n)], "score": scores, "error": errors})
    rows = RunRows.of(table, keep=6)
    expected = [5, 2 * LIGHT_BATCH_ROWS + 7, 2 * LIGHT_BATCH_ROWS + 1, 0, 1, 2]
    assert rows.worst.column("row_id").to_pylist() == [f"q{i}" for i in expected]
    assert (rows.figures["rows"], rows.figures["scored"], rows.figures["errors"]) == (n, n - 1, 2)
    last = RunRows.of(table.slice(LIGHT_BATCH_ROWS, LIGHT_BATCH_ROWS), keep=LIGHT_BATCH_ROWS)
    assert last.worst.column("row_id")[-1].as_py() == f"q{LIGHT_BATCH_ROWS + 3}"  # no score: last of all


def _pool_peak(folder) -> int:
    """Arrow's pool peak while ``bounded_results`` reads the run in ``folder``, in a fresh process."""
    script = f"""
import pyarrow as pa, pyarrow.dataset as pads
from recall_tasks.reports.run_data import bounded_results
rows = bounded_results(pads.dataset("{folder}", format="parquet"), "{RUN}")
assert rows.worst.num_rows == 50 and rows.worst.column("reason").null_count == 0
print(pa.default_memory_pool().max_memory())
"""
    return int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)


@pytest.mark.concurrency
def test_the_run_is_read_without_holding_its_rows(tmp_path):
    """Arrow's pool peaks at the same few batches for 100,000 rows as for 400,000: a table of every row's light
    columns grew it by ~12 MB over those 300,000 rows (read a batch at a time, the scores copied out: +0.4)."""
    peaks = []
    for n in (100_000, 400_000):
        table = pa.table({
            "run_id": [RUN] * n, "row_id": [f"q{i:07d}" for i in range(n)], "score": [0.9] * n,
            "error": pa.nulls(n, pa.string()), "source_row": list(range(n)),
            "reason": [f"reason {i}" for i in range(n)],
        })  # fmt: skip
        (tmp_path / str(n)).mkdir()
        pq.write_table(table, tmp_path / str(n) / "part-0.parquet", row_group_size=65_536)
        peaks.append(_pool_peak(tmp_path / str(n)))
    assert peaks[1] - peaks[0] < 2 * 2**20, peaks


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
    assert out.num_rows == 1000
    assert out.worst.column("row_id").to_pylist() == [f"q{i:07d}" for i in range(1000, 1003)]
    assert out.worst.column("verdicts").to_pylist() == [
        [{"statement": f"s{i}", "verdict": "yes"}] for i in (1000, 1001, 1002)
    ]


def test_a_drop_beyond_the_worst_rows_keeps_its_question_in_the_runs_report(tmp_path):
    """The report keeps whole rows for the worst 50 only: the comparison's drops are read by id. Here 80 rows score 0
    in both runs and row r100 drops from 1.0 to 0.5, so it is not among the worst; its question still shows."""
    from recall_tasks import evaluate

    def rows(degraded: bool) -> list[dict]:
        out = []
        for i in range(120):
            expected, chunks = f"Zebra herd {i} migrates across the plain.", ["unrelated filler text"]
            if i >= 80:
                chunks = [f"Tower {i} stands in Paris.", f"River {i} flows through the city."]
                expected = " ".join(chunks)
                chunks = chunks[:1] if degraded and i == 100 else chunks
            row = {"row_id": f"r{i}", "input": f"question {i}?", "expected_output": expected}
            out.append({**row, "retrieval_context": chunks})
        return out

    evaluate(rows(False), output=tmp_path / "out")
    current = evaluate(rows(True), output=tmp_path / "out")
    assert sorted(current.results.column("score").to_pylist())[:81] == [0.0] * 80 + [0.5]
    doc = (tmp_path / "out" / "reports" / f"{current.run['run_id']}.html").read_text()
    drops = doc.split("Largest drops", 1)[1].split("</table>", 1)[0]
    assert "<code>r100</code>" in drops and "question 100?" in drops
