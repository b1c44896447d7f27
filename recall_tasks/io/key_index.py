"""Where each row-cache key is: key -> (segment, row group), in 16 bytes an entry instead of a dict's ~125.

The row cache (``io/cache.py``) indexes every key it can serve: the keys of the segments it opened with, and every
key this run wrote. A ``dict[str, tuple]`` cost ~125 bytes an entry (the 32-character key string, its slot): 125 MB
held for the whole of a 1,000,000-row run, and as much for a rerun against that cache (issue 42, item 3).

Here an entry is a 64-bit code of the key (:func:`codes`: BLAKE2b of the key, 8 bytes) and its place packed in 64
bits, kept in sorted NumPy runs; a lookup is a ``searchsorted`` per run. Runs merge like a binary counter (the
newest merges into the one before while it is at least half its size), so there are O(log n) of them, and a
merge holds at most ~40 bytes an entry for a moment. Two keys with the same code (the chance that any two of
10^6 keys share one is ~3 in 10^8) find the newer one's place: a lookup of the other one reads a row group that
lacks it and finds nothing there, a miss (the cache filters every row group it reads by the exact keys).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

#: Bytes an entry takes (code and place), what ``docs/performance.md`` states; a merge adds ~24 for a moment.
ENTRY_BYTES = 16

_Run = TypeVar("_Run")


def push_run(runs: list[_Run], run: _Run, size: Callable[[_Run], int], merge: Callable[[_Run, _Run], _Run]) -> None:
    """Append the sorted ``run`` to ``runs`` and merge like a binary counter: while the newest run is at least half
    the one before, the two become one (``merge(older, newer)``). So ``runs`` holds O(log n) runs, each under half
    the one before it, and an entry is merged O(log n) times."""
    runs.append(run)
    while len(runs) > 1 and 2 * size(runs[-1]) >= size(runs[-2]):
        newer, older = runs.pop(), runs.pop()
        runs.append(merge(older, newer))


def codes(keys: list[str]) -> npt.NDArray[np.uint64]:
    """The 64-bit codes of ``keys``: BLAKE2b (8 bytes) of each, whatever the key's format."""
    digest = b"".join(hashlib.blake2b(k.encode("utf-8", "surrogatepass"), digest_size=8).digest() for k in keys)
    return np.frombuffer(digest, dtype=np.uint64).copy()


class KeyIndex:
    """Cache keys to ``(segment, row group)``; not thread-safe (the cache holds its lock around it)."""

    def __init__(self) -> None:
        self._runs: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]] = []

    def __len__(self) -> int:
        """Entries indexed (a key added twice counts twice until a lookup would tell them apart: never)."""
        return sum(len(run) for run, _ in self._runs)

    @property
    def nbytes(self) -> int:
        """Bytes the index holds."""
        return sum(c.nbytes + w.nbytes for c, w in self._runs)

    def add(self, keys: list[str], segment: int, row_group_sizes: list[int]) -> None:
        """``keys`` in ``segment``, in order, its row groups of ``row_group_sizes`` rows; a key indexed before now
        points here (the newer place)."""
        if not keys:
            return
        places = np.repeat(
            (np.int64(segment) << 32) | np.arange(len(row_group_sizes), dtype=np.int64),
            np.asarray(row_group_sizes, dtype=np.int64),
        )[: len(keys)]
        push_run(self._runs, _sorted(codes(keys), places), lambda run: len(run[0]), _merged)

    def find(self, keys: list[str]) -> list[tuple[int, int] | None]:
        """Each key's ``(segment, row group)``, None for a key never added."""
        if not keys or not self._runs:
            return [None] * len(keys)
        wanted = codes(keys)
        found = np.full(len(keys), -1, dtype=np.int64)
        for run, places in reversed(self._runs):  # newest first: a newer place wins
            at = np.searchsorted(run, wanted, side="right") - 1  # the last (newest) of equal codes
            hit = (at >= 0) & (found < 0)
            hit[hit] = run[at[hit]] == wanted[hit]
            found[hit] = places[at[hit]]
        return [None if p < 0 else (int(p >> 32), int(p & 0xFFFFFFFF)) for p in found.tolist()]


def _merged(
    older: tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]],
    newer: tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    return _sorted(np.concatenate([older[0], newer[0]]), np.concatenate([older[1], newer[1]]))


def _sorted(
    run: npt.NDArray[np.uint64], places: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The run sorted by code; equal codes keep their order (older first), so the last of them is the newest."""
    order = np.argsort(run, kind="stable")
    return run[order], places[order]
