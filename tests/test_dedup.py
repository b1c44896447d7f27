"""The deduplication index of a run's planning (``io/dedup.first_rows``, ``io/blocks.plan_layout``): each row's first
identical row, in at most 64 bytes a row (docs/performance.md, "1,000,000 rows")."""

from __future__ import annotations

import hashlib
import random
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq

from recall_tasks.io.blocks import plan_layout
from recall_tasks.io.datasets import open_dataset
from recall_tasks.io.dedup import DIGEST_BYTES, first_rows
from recall_tasks.io.storage import StorageConfig


def _digests(contents: list[str]) -> bytes:
    return b"".join(hashlib.blake2b(c.encode(), digest_size=DIGEST_BYTES).digest() for c in contents)


def test_each_row_gets_the_first_row_with_its_content():
    """Against a dict of first occurrences: repeats far apart, groups of several, the rest distinct."""
    rng = random.Random(3)
    contents = [f"row {rng.randrange(3000)}" for _ in range(5000)]
    first: dict[str, int] = {}
    expected = [first.setdefault(c, i) for i, c in enumerate(contents)]
    assert first_rows(_digests(contents)).tolist() == expected


def test_no_repeats_is_none():
    assert first_rows(_digests([f"row {i}" for i in range(1000)])) is None
    assert first_rows(_digests(["one"])) is None
    assert first_rows(b"") is None


def _planning_peak(folder, n: int) -> int:
    """Bytes ``plan_layout`` allocates at most (``tracemalloc``) on ``n`` distinct rows in row groups of 20,000."""
    table = pa.table({
        "row_id": [f"r{i}" for i in range(n)], "input": [f"q{i}" for i in range(n)],
        "expected_output": [f"a{i}." for i in range(n)], "retrieval_context": [[f"c{i}"] for i in range(n)],
    })  # fmt: skip
    pq.write_table(table, folder / f"rows-{n}.parquet", row_group_size=20_000)
    ds = open_dataset(str(folder / f"rows-{n}.parquet"), StorageConfig.from_options())
    tracemalloc.start()
    try:
        assert plan_layout(ds, 2000).chunks is None
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_holds_at_most_64_bytes_a_row(tmp_path):
    """What planning holds grows by at most 64 bytes a row (100,000 rows more: the same row group's transient
    objects, 100,000 more digests); a dict of hex digests to row numbers grew by ~144."""
    small, large = _planning_peak(tmp_path, 100_000), _planning_peak(tmp_path, 200_000)
    assert (large - small) / 100_000 <= 64, (small, large)
