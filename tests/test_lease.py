"""One live attempt per run (``recall_tasks/io/lease.py``) on a local folder and on S3 (SeaweedFS): the lease's
steps with an injected clock and holder, and two processes racing for one marker."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recall_tasks.io.lease import Holder, LeaseLost, RunInProgress, RunLease
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig, filesystem
from tests import s3_server as _s3

s3_server = _s3.s3_server
s3_bucket = _s3.s3_bucket

T0 = dt.datetime(2026, 12, 4, 5, 0, tzinfo=dt.UTC)
OTHER_HOST = Holder("other-host", 4242, node="another-machine", pid_start="1")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """An output URI and its storage options, on each backend."""
    if request.param == "local":
        return str(tmp_path / "out"), {}
    server: _s3.S3Server = request.getfixturevalue("s3_server")
    return f"s3://{request.getfixturevalue('s3_bucket')}/out", server.storage_options()


def lease(where: tuple[str, dict[str, str]], clock: Clock, holder: Holder | None = None, ttl: float = 60) -> RunLease:
    uri, options = where
    fs, root = filesystem(uri, StorageConfig.from_options(options))
    kw: dict[str, Any] = {"holder": holder} if holder is not None else {}
    return RunLease(fs, f"{root}/_pending/key.json", uri, ttl_s=ttl, clock=clock, **kw)


def marker(where: tuple[str, dict[str, str]]) -> dict[str, Any] | None:
    uri, options = where
    fs, root = filesystem(uri, StorageConfig.from_options(options))
    path = f"{root}/_pending/key.json"
    return json.loads(fs.cat_file(path)) if fs.exists(path) else None


def test_a_live_lease_refuses_a_second_attempt_in_one_line_and_an_expired_one_is_taken_over(where):
    clock = Clock()
    first = lease(where, clock, OTHER_HOST)
    assert first.acquire("run-1", T0) == ("run-1", T0, False)
    held = marker(where)
    assert held is not None and held["run_id"] == "run-1" and held["lease"]["host"] == "other-host"

    second = lease(where, clock)
    clock.advance(30)
    with pytest.raises(RunInProgress) as refused:
        second.acquire("run-2", clock.now)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("run in progress: run run-1 ")
    assert "since 2026-12-04 05:00:00 UTC by host other-host, process 4242" in message
    assert "renewed 30 s ago, expires in 30 s" in message and "--wait-for-lock" in message

    first.renew()  # renewed at +30 s: holds until +90 s
    clock.advance(50)
    with pytest.raises(RunInProgress):
        second.acquire("run-2", clock.now)

    clock.advance(11)  # +91 s: no renewal for 61 s, the holder crashed
    assert second.acquire("run-2", clock.now) == ("run-1", T0, True)  # resumed: the crashed attempt's run
    taken = marker(where)
    assert taken is not None and taken["lease"]["pid"] == os.getpid() and taken["run_id"] == "run-1"
    with pytest.raises(LeaseLost, match="host .*, process .* took it over"):
        first.renew()  # the crashed attempt, had it come back, learns it lost the run
    assert first.lost is not None

    second.release()  # the attempt ended without a commit: the run id stays, the lease goes
    released = marker(where)
    assert released is not None and released["lease"] is None and released["run_id"] == "run-1"
    third = lease(where, clock)
    assert third.acquire("run-3", clock.now) == ("run-1", T0, True)
    third.end()  # committed: the marker goes; the same command then starts a new run
    assert marker(where) is None
    assert lease(where, clock).acquire("run-4", clock.now) == ("run-4", clock.now, False)


@pytest.mark.concurrency
def test_a_lease_of_a_process_of_this_machine_that_is_gone_is_taken_over_at_once(where):
    clock = Clock()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me = Holder.current()
    gone = Holder(me.host, int(dead.stdout), me.node, pid_start="1")
    assert lease(where, clock, gone).acquire("run-1", T0)[2] is False
    assert lease(where, clock).acquire("run-2", T0) == ("run-1", T0, True)  # no wait for its expiry

    alive = lease(where, clock)  # this very process holds it: live, whatever the host says
    with pytest.raises(RunInProgress, match=f"process {os.getpid()} "):
        alive.acquire("run-3", T0)


def test_renewal_keeps_a_lease_live_and_two_different_runs_never_wait_for_each_other(where):
    clock = Clock()
    first = lease(where, clock, OTHER_HOST, ttl=10)
    first.acquire("run-1", T0)
    for _ in range(6):  # 60 s of a 10 s lease, renewed every 5 s
        clock.advance(5)
        first.renew()
    with pytest.raises(RunInProgress):
        lease(where, clock).acquire("run-2", clock.now)
    uri, options = where
    fs, root = filesystem(uri, StorageConfig.from_options(options))
    other_run = RunLease(fs, f"{root}/_pending/another-key.json", uri, ttl_s=10, clock=clock)
    assert other_run.acquire("run-9", clock.now) == ("run-9", clock.now, False)  # another run key: allowed


def test_a_marker_written_before_leases_is_resumed(where):
    uri, options = where
    fs, root = filesystem(uri, StorageConfig.from_options(options))
    fs.makedirs(f"{root}/_pending", exist_ok=True)
    fs.pipe_file(f"{root}/_pending/key.json", json.dumps({"run_id": "old", "started_at": T0.isoformat()}).encode())
    assert lease(where, Clock()).acquire("new", T0) == ("old", T0, True)


def _race(uris: list[str], options: dict[str, str], barrier: Any, results: Any) -> None:
    """One of two processes: for each output, wait for the other, then begin the same run."""
    for uri in uris:
        store = ResultStore(uri, StorageConfig.from_options(options))
        barrier.wait()
        try:
            run_id, _, resumed = store.begin_run("key", f"run-{os.getpid()}", T0)
            results.put((uri, "won", run_id, resumed))
        except RunInProgress as exc:
            results.put((uri, "refused", str(exc), None))
        barrier.wait()  # the winner holds its lease until both have tried
        store.release_run()


@pytest.mark.concurrency
def test_two_processes_racing_for_one_run_one_wins_the_other_is_refused(where):
    """Started together on a barrier, each round on a fresh marker: exactly one process begins the run."""
    uri, options = where
    uris = [f"{uri}/{i}" for i in range(8)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(uris, options, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range(2 * len(uris))]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for round_uri in uris:
        (_, refused, message, _), (_, won, run_id, resumed) = sorted(g for g in got if g[0] == round_uri)
        assert (won, refused, resumed) == ("won", "refused", False), got
        assert f"run {run_id} " in message, got


def test_an_attempt_whose_lease_was_taken_over_commits_nothing(where):
    """A stalled attempt (no renewal for longer than its lease) finds at its commit that another took the run."""
    from types import SimpleNamespace

    from recall_tasks.pipeline import steps

    uri, options = where
    store = ResultStore(uri, StorageConfig.from_options(options))
    run_id, _, _ = store.begin_run("key", "run-1", T0)
    store.lease._stop_renewing()  # the attempt stalls: no renewal from here
    late = Clock()
    late.now = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    fs, root = filesystem(uri, StorageConfig.from_options(options))
    taker = RunLease(fs, f"{root}/_pending/key.json", uri, ttl_s=60, clock=late, holder=OTHER_HOST)
    assert taker.acquire("run-2", late.now)[0] == run_id  # its lease expired, by the taker's clock
    with pytest.raises(LeaseLost, match=f"run {run_id}: .* other-host, process 4242 took it over: nothing committed"):
        steps.check_lease(SimpleNamespace(store=store))  # type: ignore[arg-type]
    store.end_run("key")  # the run is not this attempt's any more: its marker stays for the taker
    held = marker(where)
    assert held is not None and held["lease"]["host"] == "other-host"
