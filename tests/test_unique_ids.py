"""The ``row_id`` check of ``io/datasets.open_dataset``: every duplicate named, in a few bytes a row.

It keeps each id's 64-bit hash in the first pass and compares the ids themselves only for equal hashes: the
collision test forces every id to share one hash, so only the comparison can tell a duplicate from a collision.
"""

from __future__ import annotations

import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.errors import DatasetError
from recall_tasks.io import datasets
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.storage import StorageConfig


def _write(path, ids) -> str:
    n = len(ids)
    pq.write_table(
        pa.table({"row_id": ids, "input": ["q?"] * n, "expected_output": ["A."] * n, "retrieval_context": [["c"]] * n}),
        path,
        row_group_size=3,
    )
    return str(path)


def test_ids_sharing_a_hash_are_compared_and_only_true_duplicates_named(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "_id_hash", lambda key: len(key))  # every id of one length collides
    unique = _write(tmp_path / "unique.parquet", ["ab", "cd", "ef", "gh", "xyz"])
    assert open_dataset(unique, StorageConfig.from_options()).num_rows == 5
    uri = _write(tmp_path / "dups.parquet", ["ab", "cd", "ab", "ef", "cd", "ab", "xyz"])
    with pytest.raises(DatasetError) as info:
        open_dataset(uri, StorageConfig.from_options())
    message = str(info.value)
    assert "row_id must be unique; 3 duplicate(s): 'ab' (rows 0 and 2 of " in message, message
    assert "'cd' (rows 1 and 4 of " in message and "'ab' (rows 0 and 5 of " in message
    assert "'ef'" not in message and "'xyz'" not in message


def test_a_duplicate_far_apart_in_a_large_dataset_is_found(tmp_path):
    ids = [f"q{i:06d}" for i in range(50_000)]
    ids[40_001] = ids[7]
    with pytest.raises(DatasetError, match=r"1 duplicate\(s\): 'q000007' \(rows 7 and 40001 of "):
        open_dataset(_write(tmp_path / "d.parquet", ids), StorageConfig.from_options())


def test_the_check_keeps_a_few_bytes_a_row(tmp_path):
    """200,000 unique ids: the check's peak of Python and NumPy allocations (tracemalloc) stays under 64 bytes a
    row (its hashes: 8 while read, 8 more while sorted). A dict of every id to its row took ~200."""
    rows = 200_000
    uri = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"row_id": [f"q{i:07d}" for i in range(rows)], "input": ["q?"] * rows,
                             "expected_output": ["A."] * rows, "retrieval_context": [["c"]] * rows}),
                   uri, row_group_size=50_000)  # fmt: skip
    tracemalloc.start()
    try:
        open_dataset(uri, StorageConfig.from_options())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak / rows < 64, peak / rows
