"""The Parquet copy ``evaluate()`` writes of in-memory data: private to this user, checked by its bytes, removed
once no run needs it.

A run reads its dataset from a path, and resuming an interrupted run needs the same path and file again (the run
key holds the path, and the files' fingerprint their size and mtime: ``steps._run_key``, ``io/datasets.py``). So
a pyarrow Table, a DataFrame or a list of dicts is written once as ``<state dir>/inputs/<sha256>.parquet``, the
digest of the very bytes written: the same data is the same file, and the same ``evaluate()`` call after an
interruption resumes its run.

Decisions:

- **A private folder, not the system's temporary one.** The copy holds the questions, references and contexts,
  and whoever can write the folder chooses what a reused name holds. ``inputs`` under the per-user state
  directory (``settings.state_dir()``) is created 0700. An existing one is opened without following a symbolic
  link and checked on that handle: a symbolic link, anything but a folder, or a folder owned by another user is
  refused (:class:`ConfigError` naming it); a folder of ours that group or others may use is **repaired** to 0700
  with a warning (umask or a copy loosened it; the files in it are checked as below anyway). Whoever may write
  the state directory itself could swap ``inputs`` between the check and the run's read: group/other write on
  it is removed (with a warning) when it is ours, as a umask of 002 leaves it, and refused when it is not ours,
  unless it has the sticky bit (as /tmp has: only an entry's owner may then rename it). Its parents are not checked.
- **Files 0600, never through a link.** A copy is written to a new ``O_CREAT|O_EXCL|O_NOFOLLOW`` 0600 file in the
  folder, then renamed over the name (``os.replace`` replaces a symbolic link, it never writes where it points);
  every step is relative to the folder's handle.
- **Reused only when it is exactly this data.** An existing file at the name is used only if it is a regular file
  of ours, 0600, and its bytes equal what this data writes (compared in full, not only the name); anything else
  (other rows, a truncated file, a link, a FIFO) is replaced atomically, never read by the run.
- **Removed when no run needs it.** Each user of a copy holds a shared ``flock`` on it while its run lasts. When a
  run committed (any status: nothing is left to resume) the copy is removed, unless another ``evaluate()`` of the
  same data (another thread or process) still holds it; the last to finish removes it. A run interrupted or
  failed before its commit, or a batch run still pending, keeps the copy for the call that resumes it. A taker
  checks, once locked, that the name still holds the file it opened, so a copy removed meanwhile is written
  again, never read as gone. Copies of runs never resumed stay (private) until removed by hand.
- **A list of dicts is read by every dict's keys** (:func:`rows_table`): the columns are the union of the keys,
  in order of first appearance, a key a dict lacks is null in its row (pyarrow's ``from_pylist`` takes the first
  dict's keys: a ``row_id`` or segment column missing from row 0 was dropped from every row). A column whose
  values are of two kinds (a number, then a string) is one DatasetError naming the column and the first row
  that differs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recall_tasks.errors import ConfigError, DatasetError
from recall_tasks.settings import state_dir

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: The folder of the copies, under the state directory.
FOLDER = "inputs"
#: Times a copy is taken again when another process replaced or removed it meanwhile.
_ATTEMPTS = 8
_READ = 1 << 20


class MemoryCopy:
    """One ``evaluate()``'s hold on its copy: :attr:`path` for the run; :meth:`committed` once nothing resumes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.remove = False

    def committed(self) -> None:
        """The run committed: the copy is removed when this hold ends (unless another run holds it)."""
        self.remove = True


def rows_table(rows: list[Any]) -> pa.Table:
    """``evaluate()``'s list of dicts as a table: a column per key of any dict, null where a dict lacks it."""
    import pyarrow as pa

    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConfigError(f"evaluate() reads a list of dicts: row {i} is a {type(row).__name__}")
        for key in row:
            if not isinstance(key, str):
                raise DatasetError(f"evaluate(): a column name is a string, not {type(key).__name__}", row=i,
                                   column=repr(key))  # fmt: skip
    names = list(dict.fromkeys(key for row in rows for key in row))
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
            raise _mixed(values, name, exc) from None
    return pa.table(columns)


def _mixed(values: list[Any], name: str, exc: Exception) -> DatasetError:
    """The error of a column Arrow cannot make one array of: the first row whose value does not fit the rows
    before it (found by bisection over prefixes; Arrow's own message names neither row nor column)."""
    import pyarrow as pa

    low, high = 1, len(values)  # values[:high] fails; find the shortest failing prefix
    while low < high:
        mid = (low + high) // 2
        try:
            pa.array(values[:mid])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            high = mid
        else:
            low = mid + 1
    row = high - 1
    first = next((v for v in values[:row] if v is not None), None)
    if first is None:  # the value alone does not fit a column (an integer above 2**64, say)
        return DatasetError(f"evaluate(): a value Arrow cannot store ({' '.join(str(exc).split())[:120]})",
                            row=row, column=name)  # fmt: skip
    return DatasetError(
        f"evaluate(): one type per column: this row holds {type(values[row]).__name__}, the rows before it "
        f"{type(first).__name__}; make the column one type (str(value) for text)",
        row=row, column=name,
    )  # fmt: skip


@contextlib.contextmanager
def memory_copy(table: pa.Table) -> Iterator[MemoryCopy]:
    """``table`` as a private Parquet file named by its bytes, held while the ``with`` block runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = memoryview(sink.getvalue()).cast("B")  # pyarrow's buffers are signed bytes ("b"): != bytes above 127
    name = f"{hashlib.sha256(data).hexdigest()}.parquet"
    folder = inputs_folder()
    dir_fd = _open_folder(folder)
    try:
        fd = _hold(dir_fd, folder, name, data)
        try:
            copy = MemoryCopy(folder / name)
            yield copy
            if copy.remove:
                _remove_unless_held(dir_fd, name, fd)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def inputs_folder() -> Path:
    """Where the copies are: ``<state dir>/inputs``, absolute (the path is part of a run's key)."""
    return Path(os.path.abspath(state_dir())) / FOLDER


def _open_folder(folder: Path) -> int:
    """The checked folder's handle (see the module docstring), the folder and the state directory created 0700."""
    state = folder.parent
    try:
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_state_dir(state)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):  # Linux says ENOTDIR
            raise ConfigError(f"{folder} is a symbolic link, not a private folder: remove it") from None
        if exc.errno == errno.ENOTDIR:
            raise ConfigError(f"{folder} is not a folder: remove it") from None
        raise ConfigError(f"cannot use {folder} for in-memory data: {exc.strerror} ({exc.filename})") from None
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        if st.st_uid != me:
            raise ConfigError(
                f"{folder} is owned by uid {st.st_uid}, not by this user (uid {me}): in-memory data is not written "
                "there; remove it, or set RECALL_BENCH_STATE_DIR to a folder of your own"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode != 0o700:
            os.fchmod(fd, 0o700)
            if mode & 0o077:
                log.warning("%s was mode %04o (group or others could use it): now 0700", folder, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_state_dir(state: Path) -> None:
    """Nobody else may rename what is in ``state``: group/other write removed when it is ours, else refused."""
    st = os.stat(state)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o022 or mode & stat.S_ISVTX:
        return
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"{state} (the state directory) is writable by others (mode {mode:04o}) and owned by uid {st.st_uid}: "
            f"they could swap its {FOLDER} folder; set RECALL_BENCH_STATE_DIR to a folder of your own"
        )
    os.chmod(state, mode & ~0o022)
    log.warning("%s (the state directory) was mode %04o (others could write it): now %04o", state, mode, mode & ~0o022)


def _hold(dir_fd: int, folder: Path, name: str, data: memoryview) -> int:
    """A read handle on a file at ``name`` holding exactly ``data``, share-locked; written first when needed."""
    for _ in range(_ATTEMPTS):
        fd = _verified(dir_fd, name, data)
        if fd is None:
            fd = _written(dir_fd, folder, name, data)
        if _is_current(dir_fd, name, fd):
            return fd
        os.close(fd)  # replaced or removed by another run meanwhile: take it again
    raise ConfigError(f"{folder / name} kept changing while evaluate() wrote it: retry")


def _verified(dir_fd: int, name: str, data: memoryview) -> int | None:
    """The existing file, locked, if it is ours, 0600 and holds ``data``; None otherwise (it is then replaced)."""
    try:  # O_NONBLOCK: a FIFO planted at the name does not block the open
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symbolic link: never read where it points
            return None
        raise
    try:
        st = os.fstat(fd)
        ours = (
            stat.S_ISREG(st.st_mode)
            and st.st_uid == os.geteuid()
            and not stat.S_IMODE(st.st_mode) & 0o077
            and st.st_size == len(data)
        )
        if ours:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _same_bytes(fd, data):
                return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _same_bytes(fd: int, data: memoryview) -> bool:
    offset = 0
    while offset < len(data):
        chunk = os.pread(fd, _READ, offset)
        if not chunk or data[offset : offset + len(chunk)] != chunk:
            return False
        offset += len(chunk)
    return os.pread(fd, 1, offset) == b""


def _written(dir_fd: int, folder: Path, name: str, data: memoryview) -> int:
    """A new 0600 file holding ``data``, share-locked, renamed over ``name``."""
    part = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        offset = 0
        while offset < len(data):
            offset += os.write(fd, data[offset:])
        fcntl.flock(fd, fcntl.LOCK_SH)  # before the rename: no finished run removes it before this one reads it
        try:
            os.replace(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:  # a folder planted at the name, say
            raise ConfigError(f"cannot write {folder / name}: {exc.strerror}; remove it") from None
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(part, dir_fd=dir_fd)
        raise
    return fd


def _is_current(dir_fd: int, name: str, fd: int) -> bool:
    """``name`` is still the file ``fd`` reads (not removed, not replaced)."""
    try:
        at_name = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (at_name.st_dev, at_name.st_ino) == (held.st_dev, held.st_ino)


def _remove_unless_held(dir_fd: int, name: str, fd: int) -> None:
    """Remove the copy unless another run holds it (its shared lock then refuses this exclusive one)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # the last run to finish removes it
    if _is_current(dir_fd, name, fd):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
