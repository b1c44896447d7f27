"""The one conditional write of the output's small state objects: the run lease's marker
(:mod:`~recall_tasks.io.lease`), the ``--batch`` record (``pipeline/batch/record.py``) and the spend ledger
(``fleet/ledger.py``).

An object is read with a version (:func:`read`); it is created only if there is none (:func:`write` with version
None), replaced or deleted (:func:`delete`) only if it is still at the version read; :func:`update` reads, changes
and writes again until no other writer came in between. A version that is no longer the stored one raises
:class:`Conflict`, nothing written or deleted.

- **S3 (s3fs)**: the version is the object's ETag; a create is a ``PUT`` with ``If-None-Match: *``, a replace a
  ``PUT`` with ``If-Match: <ETag>``, a delete a ``DELETE`` with ``If-Match``; the store applies them atomically
  or refuses with 412 (AWS S3 and SeaweedFS, the test suite's server, enforce them; a store that ignores them
  loses the guarantee).
- **A local or mounted disk** (:func:`~recall_tasks.io.storage.is_local`): the version is the SHA-256 of the
  file's bytes; each read-compare-write holds an exclusive ``flock`` on ``<folder>/.lock`` for its few
  milliseconds, and a write is a temporary file renamed over the object (atomic on POSIX). NFSv4 maps the lock to
  a lock on the server.
- **Other fsspec stores**: the same steps without an atomic compare (a warning says so once): it narrows the
  race, it does not close it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from recall_tasks.io.storage import is_local

log = logging.getLogger(__name__)
_warned: set[str] = set()


class Conflict(Exception):
    """The object changed since it was read (or exists, for a create; is gone, for a replace or delete)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_s3(fs: Any) -> bool:
    return type(fs).__name__ == "S3FileSystem"


def read(fs: Any, path: str) -> tuple[bytes, str] | None:
    """The object's bytes and version, or None if there is no object."""
    if is_local(fs):
        with _locked(path) as there:
            return _local_current(path) if there else None
    if _is_s3(fs):
        return _s3_read(fs, path)
    try:
        data = bytes(fs.cat_file(path))
    except FileNotFoundError:
        return None
    return data, _sha256(data)


def write(fs: Any, path: str, data: bytes, version: str | None) -> str:
    """Create the object (``version`` None) or replace the version read; the new version. :class:`Conflict` if it
    changed."""
    if is_local(fs):
        with _locked(path, create=version is None) as there:
            _compare(_local_current(path) if there else None, version, there)
            return _local_write(path, data)
    if _is_s3(fs):
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        with _refused():
            return str(fs.pipe_file(path, data, **condition)["ETag"])
    _warn(fs)
    _compare(read(fs, path), version)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)
    return _sha256(data)


def delete(fs: Any, path: str, version: str) -> None:
    """Delete the version read; :class:`Conflict` if it changed."""
    if is_local(fs):
        with _locked(path) as there:
            _compare(_local_current(path) if there else None, version, there)
            os.remove(path)
        return
    if _is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        with _refused(gone=True):
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
        return
    _warn(fs)
    _compare(read(fs, path), version)
    fs.rm(path)


def update(fs: Any, path: str, change: Callable[[bytes | None], bytes], *, tries: int = 50) -> tuple[bytes, str]:
    """Write ``change(what is stored, or None)`` over the version read, read again and changed again while another
    writer came in between; what was written and its version. :class:`Conflict` after ``tries`` reads."""
    for _ in range(tries):
        got = read(fs, path)
        data = change(None if got is None else got[0])
        try:
            return data, write(fs, path, data, None if got is None else got[1])
        except Conflict:
            continue
    raise Conflict(f"{path} kept changing under {tries} attempts to write it")


def _compare(now: tuple[bytes, str] | None, version: str | None, there: bool = True) -> None:
    if not there or (None if now is None else now[1]) != version:
        raise Conflict


def _warn(fs: Any) -> None:
    name = type(fs).__name__
    if name not in _warned:
        _warned.add(name)
        log.warning("%s has no conditional write: state objects are compared and written in two steps", name)


# -- a local or mounted disk ------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: str, create: bool = False) -> Iterator[bool]:
    """Holds ``<folder>/.lock``; yields False (and holds nothing) when the folder is gone and ``create`` is not
    set."""
    import fcntl

    folder = os.path.dirname(path)
    if create:
        os.makedirs(folder, exist_ok=True)
    elif not os.path.isdir(folder):  # e.g. the output was deleted under a lingering renewal
        yield False
        return
    fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def _local_current(path: str) -> tuple[bytes, str] | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    return data, _sha256(data)


def _local_write(path: str, data: bytes) -> str:
    tmp = f"{path}.{os.getpid()}.tmp"  # one writer at a time: the lock is held
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return _sha256(data)


# -- S3 through s3fs --------------------------------------------------------------------------------------


def _s3_read(fs: Any, path: str) -> tuple[bytes, str] | None:
    """Body and ETag in one ``GET`` (a separate HEAD could see another version)."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)

    async def get() -> tuple[bytes, str] | None:
        try:
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return data, str(resp["ETag"])

    result: tuple[bytes, str] | None = sync(fs.loop, get)
    return result


@contextlib.contextmanager
def _refused(gone: bool = False) -> Iterator[None]:
    """A refused precondition (and with ``gone``, no object) as :class:`Conflict`."""
    try:
        yield
    except OSError as exc:
        if precondition_failed(exc) or (gone and isinstance(exc, FileNotFoundError)):
            raise Conflict from None
        raise


def precondition_failed(exc: BaseException) -> bool:
    """412 Precondition Failed (or AWS's 409 ConditionalRequestConflict for two conditional writes at once),
    however s3fs wraps it (it turns a 412 into ``OSError(EINVAL)``)."""
    cur: BaseException | None = exc
    while cur is not None:
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        cur = cur.__cause__ or cur.__context__
    text = str(exc).lower()
    if isinstance(exc, OSError) and exc.errno == errno.EINVAL and "pre-condition" in text:
        return True
    return "pre-condition" in str(exc) or "precondition" in text
