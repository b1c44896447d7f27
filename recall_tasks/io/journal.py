"""The row cache's journal: every entry reaches this machine's disk as it is put, before its segment is flushed.

Entries are appended to ``<spill dir>/journal-<instance>-<n>.jsonl`` (one ``[key, payload]`` JSON line each, an
unbuffered write: in the kernel's hands at once), so a process killed with SIGKILL loses only the judge calls in
flight, not the entries waiting for the chunk's flush. A flush starts a new file (:meth:`Journal.rotate`) and
deletes the one its segment covers once the segment is written (:func:`drop`). While its instance lives, a file
holds an exclusive ``flock``: :func:`recover` takes only files no live process holds (a torn last line, the kill
mid-write, is left out), and the cache opened next on the same URI writes them to its store as a segment.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
from pathlib import Path
from typing import IO


class Journal:
    """The journal files of one cache instance, in ``folder`` (not thread-safe: the cache calls it under its lock)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self._n = itertools.count()
        self._file: IO[bytes] | None = None

    def append(self, entries: dict[str, str]) -> None:
        """Append ``key -> payload`` entries to the open file (a new one on the first append after a rotation)."""
        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            fh = (self.folder / f"journal-{self.name}-{next(self._n):06d}.jsonl").open("ab", buffering=0)
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._file = fh
        self._file.write("".join(json.dumps([k, v], ensure_ascii=False) + "\n" for k, v in entries.items()).encode())

    def rotate(self) -> IO[bytes] | None:
        """The file the entries so far are in (None: none); the next append opens another."""
        file, self._file = self._file, None
        return file


def drop(file: IO[bytes] | None) -> None:
    """``file``'s entries are in a segment now: it goes, unlinked before its lock is let go."""
    if file is not None:
        Path(file.name).unlink(missing_ok=True)
        file.close()


def recover(folder: Path) -> list[tuple[Path, dict[str, str]]]:
    """The entries of every journal in ``folder`` that no live process holds, each file locked while it is read.

    The caller writes them to its store, then unlinks each path (:meth:`Path.unlink`, ``missing_ok``).
    """
    found: list[tuple[Path, dict[str, str]]] = []
    for path in sorted(folder.glob("journal-*.jsonl")):
        try:
            fh = path.open("rb")
        except FileNotFoundError:  # another process recovered it first
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live process is writing it
                continue
            entries: dict[str, str] = {}
            for line in fh.read().splitlines():
                with contextlib.suppress(ValueError, TypeError):
                    key, payload = json.loads(line)
                    entries[str(key)] = str(payload)
            found.append((path, entries))
    return found
