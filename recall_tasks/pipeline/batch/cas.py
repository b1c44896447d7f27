"""One writer at a time: the record is read with a version token and written only if that is still the version.

The conditional steps are :mod:`recall_tasks.io.conditional`'s (the run lease's too):

- **Object storage (S3 and compatible)**: the token is the object's ETag; a write is a conditional ``PUT``
  (``If-Match: <etag>``, or ``If-None-Match: *`` for a record that does not exist yet), which the store applies
  atomically or refuses with 412. AWS S3 has honoured both since 2024; SeaweedFS (the test suite's server) does
  too (checked by ``tests/test_batch_race.py``).
- **Local files**: the token is the SHA-256 of the file's bytes; a read and a write take an exclusive ``flock``
  on ``<record>.lock``; a write compares the file's hash with the token, then writes a temporary file and renames
  it over the record (atomic on POSIX), so two processes on one machine never both win.
- **Other fsspec stores** (GCS, Azure...): written whole without a condition (a warning says so once).

A write whose token is stale raises :class:`RecordChanged`: someone else (a ``batch cancel``, another collector)
wrote the record since it was read; the caller re-reads and decides (``settle.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from recall_tasks.errors import RecallBenchError
from recall_tasks.io.conditional import Conflict, kind_of_fs, versioned

log = logging.getLogger(__name__)
_warned: set[str] = set()


class RecordChanged(RecallBenchError):
    """The record was written by someone else since it was read (its version token is stale)."""


class Record(dict[str, Any]):
    """A record's content with the version it was read at (``token``: None for a record not written yet)."""

    token: str | None = None


def read(fs: Any, path: str) -> Record | None:
    """The record at ``path`` with its version token, or None."""
    kind = kind_of_fs(fs)
    if kind == "other":
        data = fs.cat_file(path) if fs.exists(path) else None
        got = None if data is None else (data, hashlib.sha256(data).hexdigest())
    else:
        got = versioned(fs, path, kind, lock_path=f"{path}.lock").read()
    if got is None:
        return None
    record = Record(json.loads(got[0]))
    record.token = got[1]
    return record


def write(fs: Any, path: str, record: dict[str, Any], token: str | None) -> str:
    """Write ``record`` if the stored version is still ``token`` (None: if there is none); the new token.

    Raises :class:`RecordChanged` otherwise (nothing written)."""
    data = json.dumps(record, indent=1).encode()
    kind = kind_of_fs(fs)
    if kind != "other":
        try:
            return versioned(fs, path, kind, lock_path=f"{path}.lock").write(data, token)
        except Conflict:
            raise RecordChanged(f"the batch record {path} was written by another process since it was read") from None
    if type(fs).__name__ not in _warned:
        _warned.add(type(fs).__name__)
        log.warning("%s has no conditional write: the batch record is written without compare-and-swap",
                    type(fs).__name__)  # fmt: skip
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)
    return hashlib.sha256(data).hexdigest()


def save(fs: Any, path: str, record: Record) -> None:
    """Write ``record`` over the version it was read at and keep the new version on it (see :func:`write`)."""
    record.token = write(fs, path, record, record.token)
