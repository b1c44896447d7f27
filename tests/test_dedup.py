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
from recall_tasks.io.dedup import DIGEST_BYTES, Occurrences, first_rows
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


def _hex(contents: list[str]) -> list[str]:
    return [hashlib.blake2b(c.encode(), digest_size=DIGEST_BYTES).hexdigest() for c in contents]


def test_occurrences_number_each_identity_as_a_running_dict_would():
    """Blocks of uneven sizes, repeats within a block and across blocks far apart, against a running dict."""
    rng = random.Random(5)
    ids = _hex([f"row {rng.randrange(4000)}" for _ in range(9000)])
    seen: dict[str, int] = {}
    expected = []
    for h in ids:
        seen[h] = seen.get(h, 0) + 1
        expected.append(seen[h])
    occurrences, got, at = Occurrences(), [], 0
    while at < len(ids):
        size = rng.choice([1, 7, 300, 1000])
        got += occurrences.count(ids[at : at + size])
        at += size
    assert got == expected
    assert occurrences.count([]) == []


def test_occurrences_start_from_a_workers_counts():
    """``read_block``'s case: the counts a block's identities had before it, then the block."""
    a, b, c = _hex(["a", "b", "c"])
    occurrences = Occurrences({a: 3, b: 1})
    assert occurrences.count([a, c, b, a, c]) == [4, 1, 2, 5, 2]


def test_two_identities_sharing_a_code_count_as_one_and_ids_stay_distinct():
    """The documented collision: the later identity gets ``~2`` (its id still differs from the first's)."""
    first, second = "00112233445566770000000a", "00112233445566770000000b"
    assert Occurrences().count([first, second]) == [1, 2]


def test_occurrences_hold_8_bytes_an_identity():
    occurrences = Occurrences()
    for start in range(0, 200_000, 2000):
        occurrences.count(_hex([f"row {i}" for i in range(start, start + 2000)]))
    assert occurrences.nbytes == 8 * 200_000
