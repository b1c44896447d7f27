"""One live attempt per run: the in-progress marker ``_pending/<run key>.json`` carries the attempt's lease.

The marker holds the run id (a rerun of the same command resumes it) and, while an attempt runs, its lease:
host, process id, when the attempt took it, when it last renewed it and for how long a renewal holds
(``ttl_s``, ``RECALL_BENCH_LEASE_S``, default :data:`DEFAULT_TTL_S`). The attempt renews it every third of that
while it runs, lets go of it when it ends without committing (interrupt, error, a pending ``--batch`` run: the
run id stays for the rerun) and deletes the marker once the run is committed.

A second attempt of the same run meets the lease:

- live: refused with :class:`RunInProgress` (one line: since when, which host and process), or with
  ``--wait-for-lock`` it polls until the lease is let go of, expires, or the run is committed;
- expired (no renewal for ``ttl_s`` by the reader's clock: a crashed or killed attempt), or held by a process
  of this machine that no longer exists (same host, boot and process namespace; pid gone, a zombie, or reused
  by a later process): taken over; the run resumes.

Every change of the marker (create, renewal, takeover, release, delete) is conditional on the version read
(:mod:`~recall_tasks.io.conditional`: S3 ``If-None-Match``/``If-Match``, a local ``flock`` on ``_pending/.lock``),
so two attempts racing for one marker cannot both win. Other fsspec stores get the same steps without an atomic
compare: the lease then narrows the race, it does not close it.

Expiry compares a timestamp written by the holder with the reader's clock: the hosts' clocks must agree to well
within ``ttl_s``. Two different runs (another dataset or other options) have other run keys, other markers:
they never wait for each other, even writing one output.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from recall_tasks.errors import ConfigError, WorkerDied
from recall_tasks.io import conditional
from recall_tasks.io.conditional import Conflict
from recall_tasks.io.storage import translate_storage_error
from recall_tasks.settings import settings

log = logging.getLogger(__name__)

#: Seconds a lease holds without renewal (``RECALL_BENCH_LEASE_S`` overrides): a crashed attempt on another host
#: blocks the same command for at most this long.
DEFAULT_TTL_S = 60.0

#: Seconds between two looks at a live lease with ``--wait-for-lock``.
WAIT_POLL_S = 2.0

Clock = Callable[[], dt.datetime]


class RunInProgress(ConfigError):
    """Another attempt of the same run holds a live lease: refused before any judge call (exit 2)."""


class LeaseLost(WorkerDied):
    """This attempt's lease was taken over by another attempt (it was not renewed in time): the attempt commits
    nothing and fails as a dead worker does (exit 4); the attempt holding the lease carries the run on."""


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ttl_from_settings() -> float:
    raw = settings().lease_s
    if raw is None:
        return DEFAULT_TTL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86_400:
        raise ConfigError(f"RECALL_BENCH_LEASE_S must be a number of seconds above 0 and at most 86400, got {raw!r}")
    return value


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22); None if gone."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in ("Z", "X"):  # a zombie or dead process is not running
        return None
    return fields[19] if len(fields) > 19 else ""


def _node() -> str:
    """This machine's boot and process namespace (Linux); empty elsewhere: only expiry then frees a lease."""
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = None
    return f"{boot}/{pidns}" if boot and pidns else ""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: host, process (and its start, against pid reuse), the machine's boot and namespace."""

    host: str
    pid: int
    node: str = ""
    pid_start: str = ""

    @classmethod
    def current(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), _node(), _start_ticks(os.getpid()) or "")

    def gone(self, me: Holder) -> bool:
        """True only when this holder was a process of ``me``'s machine that no longer runs."""
        if not self.node or self.node != me.node or self.host != me.host:
            return False
        return _start_ticks(self.pid) != self.pid_start


@dataclass(frozen=True)
class Lease:
    """An attempt's hold on a run (the ``lease`` object of the marker)."""

    holder: Holder
    attempt: str
    acquired: dt.datetime
    renewed: dt.datetime
    ttl_s: float

    def expires(self) -> dt.datetime:
        return self.renewed + dt.timedelta(seconds=self.ttl_s)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self.holder), "attempt": self.attempt, "acquired": self.acquired.isoformat(),
            "renewed": self.renewed.isoformat(), "ttl_s": self.ttl_s,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lease:
        holder = Holder(str(data["host"]), int(data["pid"]), str(data.get("node", "")), str(data.get("pid_start", "")))
        return cls(
            holder, str(data["attempt"]), dt.datetime.fromisoformat(data["acquired"]),
            dt.datetime.fromisoformat(data["renewed"]), float(data["ttl_s"]),
        )  # fmt: skip


# -- the marker and its lease -------------------------------------------------------------------------------


@dataclass
class RunLease:
    """The marker of one run key and this attempt's lease on it (:meth:`acquire`, renew, release, :meth:`end`).

    ``clock``, ``holder`` and ``ttl_s`` are injectable (tests); ``ttl_s`` None reads ``RECALL_BENCH_LEASE_S``.
    """

    fs: Any
    path: str
    uri: str  # the output, for error messages
    ttl_s: float | None = None
    clock: Clock = _utc_now
    holder: Holder = field(default_factory=Holder.current)
    attempt: str = field(default_factory=lambda: os.urandom(8).hex())
    run_id: str = ""
    lost: str | None = None  # why this attempt no longer holds the lease (set by a failed renewal)
    _version: str | None = None
    _record: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.ttl_s is None:
            self.ttl_s = ttl_from_settings()

    @property
    def held(self) -> bool:
        return self._version is not None and self.lost is None

    def _lease(self, acquired: dt.datetime, now: dt.datetime) -> Lease:
        return Lease(self.holder, self.attempt, acquired, now, float(self.ttl_s or DEFAULT_TTL_S))

    def _storage(self, step: Callable[..., Any], *args: Any) -> Any:
        """``step`` of :mod:`~recall_tasks.io.conditional` on the marker; a storage error as one clear line."""
        try:
            return step(self.fs, self.path, *args)
        except Conflict:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate_storage_error(exc, self.uri) from None

    def acquire(
        self,
        new_run_id: str,
        started_at: dt.datetime,
        *,
        wait: bool = False,
        on_wait: Callable[[str], None] | None = None,
    ) -> tuple[str, dt.datetime, bool]:
        """The run id for this key: an unfinished attempt's (resumed=True) or ``new_run_id`` (recorded), with
        this attempt's lease on it. A live lease of another attempt: :class:`RunInProgress`, or with ``wait``
        polled every :data:`WAIT_POLL_S` until it is let go of, expires or its run is committed; ``on_wait`` is told
        once that it waits (default: a warning in the log)."""
        said = False
        record: dict[str, Any]
        while True:
            now = self.clock()
            got = self._storage(conditional.read)
            if got is None:
                record = {"run_id": new_run_id, "started_at": started_at.isoformat(),
                          "lease": self._lease(now, now).to_json()}  # fmt: skip
                resumed = False
            else:
                data, version = got
                record = json.loads(data)
                held = record.get("lease")
                other = Lease.from_json(held) if isinstance(held, dict) else None
                if other is not None and other.expires() > now and not other.holder.gone(self.holder):
                    message = self._in_progress(record, other, now)
                    if not wait:
                        hint = "nothing judged: rerun with --wait-for-lock to wait for it, or once it has ended"
                        raise RunInProgress(f"{message}; {hint}")
                    if not said:
                        told = f"{message}; waiting until it ends or its lease expires"
                        on_wait(told) if on_wait is not None else log.warning("%s", told)
                        said = True
                    time.sleep(WAIT_POLL_S)
                    continue
                if other is not None:
                    log.warning(
                        "taking over run %s from host %s process %d (its lease %s)", record.get("run_id"),
                        other.holder.host, other.holder.pid,
                        "expired" if other.expires() <= now else "holder is no longer running",
                    )  # fmt: skip
                record["lease"] = self._lease(now, now).to_json()
                resumed = True
            try:
                payload = json.dumps(record).encode()
                self._version = self._storage(conditional.write, payload, None if got is None else got[1])
            except Conflict:
                continue  # another attempt changed the marker between our read and write: look again
            self._record = record
            self.run_id = str(record["run_id"])
            return self.run_id, dt.datetime.fromisoformat(record["started_at"]), resumed

    def _in_progress(self, record: dict[str, Any], other: Lease, now: dt.datetime) -> str:
        since = other.acquired.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        ago = max(0, round((now - other.renewed).total_seconds()))
        left = max(0, round((other.expires() - now).total_seconds()))
        return (
            f"run in progress: run {record.get('run_id')} of this command is being judged since {since} by host "
            f"{other.holder.host}, process {other.holder.pid} (lease renewed {ago} s ago, expires in {left} s "
            "unless renewed)"
        )

    def renew(self) -> None:
        """Extend this attempt's lease; :class:`LeaseLost` (and :attr:`lost` set) if another attempt took it."""
        with self._lock:
            if self._version is None or self.lost is not None:
                return
            lease = Lease.from_json(self._record["lease"])
            record = {**self._record, "lease": self._lease(lease.acquired, self.clock()).to_json()}
            try:
                payload = json.dumps(record).encode()
                self._version = self._storage(conditional.write, payload, self._version)
            except Conflict:
                got = self._storage(conditional.read)
                who = "the run was committed" if got is None else self._taker(got[0])
                self.lost = f"run {self.run_id}: this attempt's lease was not renewed in time and {who}"
                raise LeaseLost(self.lost) from None
            self._record = record

    @staticmethod
    def _taker(data: bytes) -> str:
        held = json.loads(data).get("lease")
        if not isinstance(held, dict):
            return "another attempt let go of it"
        other = Lease.from_json(held)
        return f"host {other.holder.host}, process {other.holder.pid} took it over"

    def start_renewing(self, interval_s: float | None = None, on_lost: Callable[[str], None] | None = None) -> None:
        """Renew in a daemon thread every ``interval_s`` (default a third of the lease) until release or end."""
        interval = interval_s if interval_s is not None else float(self.ttl_s or DEFAULT_TTL_S) / 3

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.renew()
                except LeaseLost as exc:
                    log.error("%s", exc)
                    if on_lost is not None:
                        on_lost(str(exc))
                    return
                except Exception as exc:  # noqa: BLE001 - a storage hiccup: the next tick tries again
                    log.warning("could not renew the lease of run %s: %s", self.run_id, exc)

        self._thread = threading.Thread(target=loop, name=f"recall-bench-lease-{self.run_id}", daemon=True)
        self._thread.start()

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def release(self) -> None:
        """Let go of the lease, keep the marker (its run id resumes with the next attempt). Never raises."""
        self._stop_renewing()
        with self._lock:
            if self._version is None or self.lost is not None:
                return
            record = {**self._record, "lease": None}
            try:
                conditional.write(self.fs, self.path, json.dumps(record).encode(), self._version)
            except Exception as exc:  # noqa: BLE001 - an unreleased lease expires (or its process is gone)
                log.warning("could not let go of the lease of run %s: %s", self.run_id, exc)
            self._version = None

    def end(self) -> None:
        """The run is committed: delete the marker (if this attempt still holds it), so the same command starts
        a new run."""
        self._stop_renewing()
        with self._lock:
            version, self._version = self._version, None
            if version is None or self.lost is not None:
                return
            try:
                self._storage(conditional.delete, version)
            except Conflict:
                log.warning("run %s: the marker changed under this attempt; left as it is", self.run_id)
