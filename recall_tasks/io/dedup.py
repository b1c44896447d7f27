"""The deduplication index of a run's planning (``io/blocks.plan_layout``): which rows repeat an earlier row.

Rows with the same content hash (``io/blocks.content_hash``) are judged once, in one chunk. Planning finds them in
one pass over the dataset; this module holds what that pass keeps per row: the 12-byte digest, nothing else.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recall_tasks.io.key_index import push_run

#: Bytes of a content hash (``io/blocks.content_hash``: BLAKE2b, 12 bytes, in hexadecimal there).
DIGEST_BYTES = 12


def first_rows(digests: bytes | bytearray) -> npt.NDArray[np.int64] | None:
    """Each row's first row with the same content hash (``digests``: :data:`DIGEST_BYTES` per row, in order), or
    None when no two rows have the same.

    The deduplication index of ``io/blocks.plan_layout``: the digests as raw bytes (12 bytes a row) sorted by NumPy
    (``lexsort``: stable, so the first of equal digests is the earliest row), at most ~33 bytes a row while it
    runs, ~44 with repeats (the answer's 8 included). A dict of hex strings to row numbers cost ~150 bytes a row:
    150 MB while a 1,000,000-row run planned its chunks (issue 42, item 3).
    """
    n = len(digests) // DIGEST_BYTES
    if n < 2:
        return None
    rows = np.frombuffer(digests, dtype=np.dtype([("hi", ">u8"), ("lo", ">u4")]), count=n)
    order = np.lexsort((rows["lo"], rows["hi"]))
    hi, lo = rows["hi"][order], rows["lo"][order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    del hi, lo
    if starts.all():
        return None
    group_start = np.arange(n, dtype=np.int64)  # each sorted position's group start, then that group's first row
    group_start[~starts] = 0
    del starts
    np.maximum.accumulate(group_start, out=group_start)
    first = order[group_start]
    del group_start
    lead = np.empty(n, dtype=np.int64)
    lead[order] = first
    return lead


class Occurrences:
    """How many times each row identity occurred so far in a pass over the dataset: the ``~N`` suffixes of the row
    ids of a dataset without a ``row_id`` column (``io/blocks.role_block``).

    An identity (a hex digest, ``io/blocks.identity_hash``) is kept as a 64-bit code, its first 8 bytes, in sorted
    NumPy runs merged like a binary counter (``io/key_index.py``): 8 bytes an identity, ~24 more for a moment while
    runs merge; a count only for the identities that repeat. A dict of every digest to its count held ~110 bytes an
    identity for the whole run (110 MiB at 1,000,000 rows, issue 42 item 3). Two distinct identities with the same
    code (the chance that any two of 10^6 share one is ~3 in 10^8) count as one: the later row's id gets a ``~2``
    it would not have had. Ids stay unique and stable (one dataset, one order), only less tidy.
    """

    def __init__(self, counts: dict[str, int] | None = None) -> None:
        """``counts``: identities already seen and how many times (a worker's block, ``io/blocks.read_block``)."""
        self._runs: list[npt.NDArray[np.uint64]] = []
        self._repeats: dict[int, int] = {}
        if counts:
            keys = list(counts)
            codes = _codes(keys)
            self._add(np.unique(codes))
            for code, n in zip(codes.tolist(), (counts[k] for k in keys), strict=True):
                if n > 1:
                    self._repeats[code] = max(n, self._repeats.get(code, 0))

    @property
    def nbytes(self) -> int:
        """Bytes the sorted runs hold (the repeats' counts aside)."""
        return sum(run.nbytes for run in self._runs)

    def count(self, identities: list[str]) -> list[int]:
        """Each identity's occurrence number (1 the first time), counting these ones in order."""
        if not identities:
            return []
        codes = _codes(identities)
        found = np.zeros(len(codes), dtype=bool)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, codes), len(run) - 1)
            found |= run[at] == codes
        numbers: list[int] = []
        here: dict[int, int] = {}
        fresh: list[int] = []
        for code, before in zip(codes.tolist(), found.tolist(), strict=True):
            n = here.get(code)
            if n is None:
                if before:
                    n = self._repeats.get(code, 1)
                else:
                    n = 0
                    fresh.append(code)
            here[code] = n = n + 1
            numbers.append(n)
        for code, n in here.items():
            if n > 1:
                self._repeats[code] = n
        if fresh:
            self._add(np.sort(np.array(fresh, dtype=np.uint64)))
        return numbers

    def _add(self, run: npt.NDArray[np.uint64]) -> None:
        push_run(self._runs, run, len, lambda older, newer: np.sort(np.concatenate([older, newer])))


def _codes(identities: list[str]) -> npt.NDArray[np.uint64]:
    """The first 8 bytes of each hex digest as a 64-bit code."""
    return np.frombuffer(bytes.fromhex("".join(h[:16] for h in identities)), dtype=">u8").astype(np.uint64)
