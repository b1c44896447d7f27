"""The deduplication index of a run's planning (``io/blocks.plan_layout``): which rows repeat an earlier row.

Rows with the same content hash (``io/blocks.content_hash``) are judged once, in one chunk. Planning finds them in
one pass over the dataset; this module holds what that pass keeps per row: the 12-byte digest, nothing else.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

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
