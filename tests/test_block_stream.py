"""``io/blocks.iter_blocks`` decodes a block at a time, not a row group at a time.

A Parquet writer chooses its row groups (pyarrow's default holds a million rows): the run's chunks must not hold a
whole group decoded. The blocks keep the boundaries they always had (every ``--chunk-size`` rows from each group's
start): worker processes re-read a block by its first row and length, and the chunk cache is keyed by them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.io.blocks import iter_blocks, read_block, role_block
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig

ROOT = Path(__file__).resolve().parents[1]


def _write(path, rows: int, group_rows: int, context_bytes: int = 20) -> str:
    pad = "x" * context_bytes
    table = pa.table({
        "row_id": [f"r{i}" for i in range(rows)], "input": [f"question {i}?" for i in range(rows)],
        "expected_output": [f"Answer {i}." for i in range(rows)],
        "retrieval_context": [[f"chunk {i} {pad}", f"other {i}"] for i in range(rows)],
        "segment": [i % 3 for i in range(rows)],
    })  # fmt: skip
    pq.write_table(table, path, row_group_size=group_rows)
    return str(path)


def test_blocks_are_cut_from_each_groups_start_with_every_row_once(tmp_path):
    """Groups of 25 rows (the last 15), blocks of 10: 10, 10, 5 per group, in order, each equal to the same rows
    sliced from the whole table, and equal to what :func:`read_block` re-reads."""
    uri = _write(tmp_path / "d.parquet", rows=90, group_rows=25)
    ds = open_dataset(uri, StorageConfig.from_options())
    blocks = list(iter_blocks(ds, 10))
    assert [(b.first_row, b.table.num_rows) for b in blocks] == [
        (0, 10), (10, 10), (20, 5), (25, 10), (35, 10), (45, 5), (50, 10), (60, 10), (70, 5), (75, 10), (85, 5)
    ]  # fmt: skip
    whole = pq.read_table(uri)
    file_uri = ds.files[0].uri
    for b in blocks:
        expected = role_block(ds, file_uri, b.first_row, whole.slice(b.first_row, b.table.num_rows), ds.columns)
        assert b.row_ids == expected.row_ids == [f"r{i}" for i in range(b.first_row, b.first_row + b.table.num_rows)]
        assert b.content_hashes == expected.content_hashes
        assert b.table.equals(expected.table)
        again = read_block(ds, file_uri, b.first_row, b.table.num_rows)
        assert again.row_ids == b.row_ids and again.table.equals(b.table)


def test_a_block_larger_than_a_group_stops_at_the_groups_end(tmp_path):
    uri = _write(tmp_path / "d.parquet", rows=30, group_rows=7)
    ds = open_dataset(uri, StorageConfig.from_options())
    blocks = [(b.first_row, b.table.num_rows) for b in iter_blocks(ds, 100)]
    assert blocks == [(0, 7), (7, 7), (14, 7), (21, 7), (28, 2)]


def test_a_large_row_group_is_never_held_decoded_while_its_blocks_stream(tmp_path):
    """One 20,000-row group of ~1 KB contexts (~21 MB decoded), blocks of 500 rows: while the blocks stream, Arrow
    holds ~5 MB (a block, the column chunks' compressed pages and their dictionaries; ~11 MB for an 80,000-row
    group), under a third of the group. Reading the group whole held all of it until its last block."""
    uri = _write(tmp_path / "d.parquet", rows=20_000, group_rows=20_000, context_bytes=1_000)
    group_bytes = pq.read_table(uri).nbytes
    ds = open_dataset(uri, StorageConfig.from_options())
    held = []
    rows = 0
    for block in iter_blocks(ds, 500):
        rows += block.table.num_rows
        held.append(pa.total_allocated_bytes())
        del block
    assert rows == 20_000 and len(held) == 40
    assert max(held) < group_bytes / 3, (max(held), group_bytes)


_READ_BLOCK_PEAK = """
import json, sys
import pyarrow as pa
from recall_tasks.io.blocks import read_block
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig
ds = open_dataset(sys.argv[1], StorageConfig.from_options())
before = pa.default_memory_pool().max_memory()
block = read_block(ds, ds.files[0].uri, int(sys.argv[2]), 500)
print(json.dumps({"before": before, "peak": pa.default_memory_pool().max_memory(), "ids": block.row_ids[:1]}))
"""


@pytest.mark.concurrency  # a subprocess
def test_a_worker_reading_a_block_decodes_up_to_it_not_its_whole_group(tmp_path):
    """A worker process re-reads its block (``read_block``): for the last 500 rows of a 20,000-row group, Arrow's
    peak stays under a third of the group, where reading the group whole took all of it. A fresh process: Arrow's
    peak cannot be reset."""
    uri = _write(tmp_path / "d.parquet", rows=20_000, group_rows=20_000, context_bytes=1_000)
    proc = subprocess.run([sys.executable, "-c", _READ_BLOCK_PEAK, uri, "19500"], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ids"] == ["r19500"]
    group_bytes = pq.read_table(uri).nbytes
    assert result["peak"] - result["before"] < group_bytes / 3, (result, group_bytes)


def test_read_block_takes_any_rows_of_a_group(tmp_path):
    """Rows across the re-read's batch boundaries, the group's last row, and a file shorter than asked."""
    uri = _write(tmp_path / "d.parquet", rows=60, group_rows=27)
    ds = open_dataset(uri, StorageConfig.from_options())
    file_uri = ds.files[0].uri
    for first, rows, ids in [(3, 5, range(3, 8)), (20, 7, range(20, 27)), (26, 1, [26]), (27, 27, range(27, 54))]:
        assert read_block(ds, file_uri, first, rows).row_ids == [f"r{i}" for i in ids]
    assert read_block(ds, file_uri, 58, 10).row_ids == ["r58", "r59"]


def test_text_that_is_not_utf8_is_one_dataset_error_naming_its_column_and_row(tmp_path):
    """Arrow does not check a string column's UTF-8 when it reads a file (a JSON lines export with a stray
    ``\\xff`` in a context): reading the rows is one DatasetError naming the column and the row, not a
    UnicodeDecodeError out of the middle of the run."""
    from recall_tasks.errors import DatasetError

    lines = [json.dumps({"row_id": f"r{i}", "input": f"q {i}?", "expected_output": f"A {i}.",
                         "retrieval_context": [f"chunk {i}"]}).encode() for i in range(30)]  # fmt: skip
    lines[17] = lines[17].replace(b'"retrieval_context": ["', b'"retrieval_context": ["\xff\xfe ', 1)
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DatasetError, match=r"line 18 .*row 17, column 'retrieval_context'"):
        open_dataset(str(path), StorageConfig.from_options())  # a JSON lines file: refused when opened (textfiles)
    import pyarrow.json as pjson

    exported = tmp_path / "d.parquet"  # the same bytes through Arrow to Parquet, unchecked: found when read
    pq.write_table(pjson.read_json(path), exported)
    ds = open_dataset(str(exported), StorageConfig.from_options())
    with pytest.raises(DatasetError, match=r"column 'retrieval_context' holds text that is not valid UTF-8 in row 17"):
        list(iter_blocks(ds, 10))
