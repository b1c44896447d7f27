"""Compare-and-swap on one small object: read it with a version, write or delete it only if that is still the
version. Used by the run lease (:mod:`~recall_tasks.io.lease`) and the ``--batch`` record
(``pipeline/batch/cas.py``).

- **S3 (s3fs)**: the version is the object's ETag; a create is a ``PUT`` with ``If-None-Match: *``, a replace a
  ``PUT`` with ``If-Match: <ETag>``, a delete a ``DELETE`` with ``If-Match``; the store applies them atomically
  or refuses with 412 (AWS S3 and SeaweedFS, the test suite's server, enforce them; a store that ignores them
  loses the guarantee).
- **A local or mounted disk**: the version is the SHA-256 of the file's bytes; each read-compare-write holds an
  exclusive ``flock`` on a lock file (which one is the caller's choice) for its few milliseconds, and a write is a
  temporary file renamed over the object (atomic on POSIX). NFSv4 maps the lock to a lock on the server.
- **Other fsspec stores**: the same steps without an atomic compare (:class:`OtherObject`): it narrows the race,
  it does not close it.

A version that is no longer the stored one raises :class:`Conflict` (nothing written or deleted).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator
from typing import Any, Literal, Protocol

from recall_tasks.io.storage import S3_PROTOCOLS, split_uri

Kind = Literal["local", "s3", "other"]


class Conflict(Exception):
    """The object changed since it was read (or exists, for a create; is gone, for a replace or delete)."""


class Versioned(Protocol):
    """One object read with a version and changed only at that version."""

    def read(self) -> tuple[bytes, str] | None:
        """The object's bytes and version, or None if there is no object."""
        ...

    def write(self, data: bytes, version: str | None) -> str:
        """Create (``version`` None) or replace the version read; the new version. :class:`Conflict` if it
        changed."""
        ...

    def delete(self, version: str) -> None:
        """Delete the version read; :class:`Conflict` if it changed."""
        ...


def kind_of_uri(uri: str) -> Kind:
    """The kind of store ``uri`` is on, by its scheme."""
    protocol, _ = split_uri(uri)
    return "local" if protocol == "file" else "s3" if protocol in S3_PROTOCOLS else "other"


def kind_of_fs(fs: Any) -> Kind:
    """The kind of store an fsspec filesystem is, by its class."""
    name = type(fs).__name__
    return "local" if name == "LocalFileSystem" else "s3" if name == "S3FileSystem" else "other"


def versioned(fs: Any, path: str, kind: Kind, *, lock_path: str | None = None) -> Versioned:
    """The object at ``path`` of ``fs`` (a store of ``kind``); a local one locks ``lock_path`` (by default
    ``<folder>/.lock``) around each step."""
    if kind == "local":
        return LocalObject(path, lock_path or os.path.join(os.path.dirname(path), ".lock"))
    if kind == "s3":
        return S3Object(fs, path)
    return OtherObject(fs, path)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalObject:
    """A local or mounted disk: every step under an exclusive ``flock`` on ``lock_path``."""

    def __init__(self, path: str, lock_path: str) -> None:
        self.path = path
        self.lock_path = lock_path

    @contextlib.contextmanager
    def _locked(self, create: bool = False) -> Iterator[bool]:
        """Holds the lock; yields False (and holds nothing) when the folder is gone and ``create`` is not set."""
        import fcntl

        folder = os.path.dirname(self.path)
        if create:
            os.makedirs(folder, exist_ok=True)
        elif not os.path.isdir(folder):  # e.g. the output was deleted under a lingering renewal
            yield False
            return
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def _current(self) -> tuple[bytes, str] | None:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        return data, _sha256(data)

    def read(self) -> tuple[bytes, str] | None:
        with self._locked() as there:
            return self._current() if there else None

    def _write(self, data: bytes) -> str:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        return _sha256(data)

    def write(self, data: bytes, version: str | None) -> str:
        with self._locked(create=version is None) as there:
            now = self._current() if there else None
            if not there or (now is None) != (version is None) or (now is not None and now[1] != version):
                raise Conflict
            return self._write(data)

    def delete(self, version: str) -> None:
        with self._locked() as there:
            now = self._current() if there else None
            if now is None or now[1] != version:
                raise Conflict
            os.remove(self.path)


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


class S3Object:
    """S3 through s3fs: ``If-None-Match: *`` to create, ``If-Match: <ETag>`` to replace or delete."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.path = path
        self.bucket, self.key, _ = fs.split_path(path)

    def read(self) -> tuple[bytes, str] | None:
        """Body and ETag in one ``GET`` (a separate HEAD could see another version)."""
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str] | None:
            try:
                resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            except FileNotFoundError:
                return None
            body = resp["Body"]
            try:
                data = await body.read()
            finally:
                body.close()
            return data, str(resp["ETag"])

        result: tuple[bytes, str] | None = sync(self.fs.loop, get)
        return result

    def write(self, data: bytes, version: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            out = self.fs.pipe_file(self.path, data, **condition)
        except OSError as exc:
            if precondition_failed(exc):
                raise Conflict from None
            raise
        return str(out["ETag"])

    def delete(self, version: str) -> None:
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=version)
        except FileNotFoundError:
            raise Conflict from None
        except OSError as exc:
            if precondition_failed(exc):
                raise Conflict from None
            raise


class OtherObject:
    """Another fsspec store: the same steps, the compare not atomic (module doc)."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.path = path

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = bytes(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None
        return data, _sha256(data)

    def write(self, data: bytes, version: str | None) -> str:
        now = self.read()
        if (now is None) != (version is None) or (now is not None and now[1] != version):
            raise Conflict
        self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(self.path, data)
        return _sha256(data)

    def delete(self, version: str) -> None:
        now = self.read()
        if now is None or now[1] != version:
            raise Conflict
        self.fs.rm(self.path)
