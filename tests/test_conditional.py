"""The one conditional write (``io/conditional.py``) under its three users, on a local folder and on S3
(SeaweedFS): two threads race the same object, both having read the same version (held at a barrier right after
their first read), so both write at that version: one wins, the other sees the conflict. The ``--batch`` record's
race is tests/test_batch_race.py's (six writers on each backend)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from recall_tasks.fleet import ledger
from recall_tasks.fleet.guards import Budget
from recall_tasks.io import conditional
from recall_tasks.io.lease import Holder, RunInProgress, RunLease
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig, filesystem, is_local
from tests import s3_server as _s3
from tests.test_lease import OTHER_HOST, T0, Clock

s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, StorageConfig]:
    if request.param == "local":
        return str(tmp_path / "out"), StorageConfig()
    server: _s3.S3Server = request.getfixturevalue("s3_server")
    return f"s3://{request.getfixturevalue('s3_bucket')}/out", StorageConfig.from_options(server.storage_options())


class Race:
    """Two threads, each held after its first :func:`conditional.read` until the other has read too; every
    conditional write's outcome by thread (the version written, or the Conflict)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.barrier = threading.Barrier(2, timeout=30)
        self.racers: set[str] = set()  # the threads of run(), by name
        self.held: set[str] = set()
        self.writes: dict[str, list[str]] = {}
        read, write = conditional.read, conditional.write

        def held_read(fs: Any, path: str) -> Any:
            got = read(fs, path)
            me = threading.current_thread().name
            if me in self.racers and me not in self.held:
                self.held.add(me)
                self.barrier.wait()
            return got

        def counted_write(*args: Any) -> str:
            try:
                version = write(*args)
            except conditional.Conflict:
                self.writes.setdefault(threading.current_thread().name, []).append("conflict")
                raise
            self.writes.setdefault(threading.current_thread().name, []).append("written")
            return version

        monkeypatch.setattr(conditional, "read", held_read)
        monkeypatch.setattr(conditional, "write", counted_write)

    def run(self, **writers: Callable[[], Any]) -> dict[str, Any]:
        """What each writer returned or raised."""
        out: dict[str, Any] = {}
        self.racers = set(writers)

        def one(name: str, fn: Callable[[], Any]) -> None:
            try:
                out[name] = fn()
            except Exception as exc:  # noqa: BLE001 - the loser's error is part of the result
                out[name] = exc

        threads = [threading.Thread(target=one, args=item, name=item[0]) for item in writers.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Race:
    return Race(monkeypatch)


@pytest.mark.concurrency
def test_two_attempts_taking_one_runs_lease_at_once_one_holds_it_the_other_is_refused(where, race):
    uri, storage = where
    fs, root = filesystem(uri, storage)
    me = Holder.current()

    def attempt(holder: Holder, run_id: str) -> Callable[[], Any]:
        lease = RunLease(fs, f"{root}/_pending/key.json", uri, ttl_s=60, clock=Clock(), holder=holder)
        return lambda: (lease.acquire(run_id, T0), lease)

    got = race.run(a=attempt(OTHER_HOST, "run-a"), b=attempt(me, "run-b"))
    (winner,) = [n for n, r in got.items() if not isinstance(r, Exception)]
    (loser,) = {"a", "b"} - {winner}
    (run_id, _, resumed), lease = got[winner]
    assert run_id == f"run-{winner}" and resumed is False and lease.held
    assert isinstance(got[loser], RunInProgress) and f"run run-{winner} " in str(got[loser])
    assert race.writes == {winner: ["written"], loser: ["conflict"]}  # both created it; the store refused one
    stored = conditional.read(fs, f"{root}/_pending/key.json")
    assert stored is not None and stored[1] == lease._version  # the winner's marker, as it wrote it


@pytest.mark.concurrency
def test_two_writers_of_one_ledger_file_at_once_both_land_once_and_the_later_figure_stays(where, race):
    uri, storage = where
    store = ResultStore(uri, storage)

    def writer(requests: int) -> Callable[[], None]:
        budget = Budget(max_requests=100)
        budget.requests = requests
        return lambda: ledger.record(store, "run-key", "attempt-1", budget)

    got = race.run(a=writer(5), b=writer(7))
    assert got == {"a": None, "b": None}
    (loser,) = [n for n, w in race.writes.items() if w == ["conflict", "written"]]
    (winner,) = [n for n, w in race.writes.items() if w == ["written"]]
    assert {loser, winner} == {"a", "b"}  # both created the file; one was refused, read it again and wrote
    assert ledger.spent(store, "run-key") == ({"a": 5, "b": 7}[loser], 0.0)  # the last write's figure, whole


def test_is_local_names_this_machines_disk_by_uri_or_filesystem(tmp_path):
    assert is_local(str(tmp_path)) and is_local("relative/out") and is_local(f"file://{tmp_path}")
    assert is_local(f"FILE://{tmp_path}") and is_local(fsspec.filesystem("file"))
    assert not is_local("s3://bucket/out") and not is_local("gs://bucket/out") and not is_local("memory://out")
    assert not is_local(fsspec.filesystem("memory"))
