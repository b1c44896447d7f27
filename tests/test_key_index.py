"""The row cache's key index (``io/key_index.py``): the places a dict would give, in 16 bytes an entry."""

from __future__ import annotations

import random

from recall_tasks.io.cache import RowVerdictCache
from recall_tasks.io.key_index import ENTRY_BYTES, KeyIndex
from recall_tasks.io.storage import StorageConfig
from recall_tasks.judges.base import JudgeResponse, JudgeVerdict


def test_places_equal_a_dicts_through_merges_and_overwrites():
    """Segments added one after another (the index merges its runs): every key finds the place a dict updated in
    the same order holds (a key written again: its newer place), an absent key None."""
    rng = random.Random(7)
    index, model = KeyIndex(), {}
    for segment in range(40):
        keys = [f"{rng.getrandbits(128):032x}" for _ in range(rng.randint(1, 700))]
        keys += rng.sample(sorted(model), min(len(model), 30))  # keys written again by a later segment
        sizes = [250] * (len(keys) // 250) + ([len(keys) % 250] if len(keys) % 250 else [])
        index.add(keys, segment, sizes)
        for i, key in enumerate(keys):
            model[key] = (segment, i // 250)
    asked = [*rng.sample(sorted(model), 2000), "absent", "k1", ""]
    assert index.find(asked) == [model.get(k) for k in asked]
    assert len(index._runs) <= 12  # merged like a binary counter, not one run per segment


def test_an_entry_takes_sixteen_bytes():
    """What docs/performance.md states: 16 bytes an entry, far under the 64 a row the scale budget allows."""
    index = KeyIndex()
    for segment in range(50):
        index.add([f"{segment}-{i}" for i in range(2000)], segment, [2048])
    assert len(index) == 100_000
    assert index.nbytes == ENTRY_BYTES * len(index) == 1_600_000


def test_the_row_cache_indexes_what_it_writes_in_the_compact_index(tmp_path):
    """A run's own writes are indexed compactly, and found again by the same process."""
    cache = RowVerdictCache(str(tmp_path / "cache"), StorageConfig.from_options(), flush_rows=100)
    response = JudgeResponse(verdicts=[JudgeVerdict(id=1, verdict="yes", chunk_ids=[1])], model="m", prompt_version="v")
    for start in range(0, 1000, 100):
        cache.put_many({f"key-{i}": response for i in range(start, start + 100)})
    assert cache.size == 1000 and cache._index.nbytes == ENTRY_BYTES * 1000
    found = cache.get_many(["key-5", "key-999", "key-1000"])
    assert sorted(found) == ["key-5", "key-999"]
    assert found["key-5"].verdicts[0].verdict == "yes"
