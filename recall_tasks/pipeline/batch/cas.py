"""One writer at a time: the record is read with a version token and written only if that is still the version.

- **Object storage (S3 and compatible)**: the token is the object's ETag; a write is a conditional ``PUT``
  (``If-Match: <etag>``, or ``If-None-Match: *`` for a record that does not exist yet), which the store applies
  atomically or refuses with 412. AWS S3 has honoured both since 2024; SeaweedFS (the test suite's server) does
  too (checked by ``tests/test_batch_race.py``).
- **Local files**: the token is the SHA-256 of the file's bytes; a write takes an exclusive ``flock`` on
  ``<record>.lock``, compares the file's hash with the token, then writes a temporary file and renames it over the
  record (atomic on POSIX), so two processes on one machine never both win.
- **Other fsspec stores** (GCS, Azure...): written whole without a condition (a warning says so once).

A write whose token is stale raises :class:`RecordChanged`: someone else (a ``batch cancel``, another collector)
wrote the record since it was read; the caller re-reads and decides (``settle.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any

from recall_tasks.errors import RecallBenchError

log = logging.getLogger(__name__)
_warned: set[str] = set()


class RecordChanged(RecallBenchError):
    """The record was written by someone else since it was read (its version token is stale)."""


class Record(dict[str, Any]):
    """A record's content with the version it was read at (``token``: None for a record not written yet)."""

    token: str | None = None


def _kind(fs: Any) -> str:
    name = type(fs).__name__
    return "local" if name == "LocalFileSystem" else "s3" if name == "S3FileSystem" else "other"


def read(fs: Any, path: str) -> Record | None:
    """The record at ``path`` with its version token, or None."""
    kind = _kind(fs)
    if kind == "s3":
        data, token = _s3_get(fs, path)
    elif kind == "local":
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            data = None
        token = None if data is None else hashlib.sha256(data).hexdigest()
    else:
        data = fs.cat_file(path) if fs.exists(path) else None
        token = None if data is None else hashlib.sha256(data).hexdigest()
    if data is None:
        return None
    record = Record(json.loads(data))
    record.token = token
    return record


def write(fs: Any, path: str, record: dict[str, Any], token: str | None) -> str:
    """Write ``record`` if the stored version is still ``token`` (None: if there is none); the new token.

    Raises :class:`RecordChanged` otherwise (nothing written)."""
    data = json.dumps(record, indent=1).encode()
    kind = _kind(fs)
    if kind == "s3":
        return _s3_put(fs, path, data, token)
    if kind == "local":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with _locked(f"{path}.lock"):
            try:
                with open(path, "rb") as fh:
                    current: str | None = hashlib.sha256(fh.read()).hexdigest()
            except FileNotFoundError:
                current = None
            if current != token:
                raise RecordChanged(f"the batch record {path} was written by another process since it was read")
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        return hashlib.sha256(data).hexdigest()
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


@contextlib.contextmanager
def _locked(lock_path: str) -> Iterator[None]:
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _s3_get(fs: Any, path: str) -> tuple[bytes | None, str | None]:
    """Body and ETag in one ``GET`` (a separate HEAD could see another version)."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)

    async def get() -> tuple[bytes | None, str | None]:
        try:
            reply = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None, None
        async with reply["Body"] as body:
            data: bytes = await body.read()
        return data, str(reply["ETag"])

    result: tuple[bytes | None, str | None] = sync(fs.loop, get)
    return result


def _s3_put(fs: Any, path: str, data: bytes, token: str | None) -> str:
    condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
    try:
        reply = fs.pipe_file(path, data, **condition)
    except OSError as exc:
        if _precondition_failed(exc):
            raise RecordChanged(f"the batch record {path} was written by another process since it was read") from None
        raise
    return str(reply["ETag"])


def _precondition_failed(exc: BaseException) -> bool:
    """412 Precondition Failed (or AWS's 409 ConditionalRequestConflict), however s3fs wraps it."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        seen = seen.__cause__ or seen.__context__
    return "pre-condition" in str(exc) or "precondition" in str(exc).lower()
