"""``evaluate()``'s copy of in-memory data (issue 58, item 4): in a private per-user folder, never a shared name.

The copy was ``<system temp>/recall-bench-inputs/<digest>.parquet``, mode 0644, kept forever and reused whatever
it held: another user of the host read the questions and contexts, or planted a file at that name that made
``evaluate(mine)`` score someone else's rows. Now it is ``<state dir>/inputs/<sha256 of its bytes>.parquet``:
the folder 0700 (repaired when it is ours and looser, refused when it is someone else's or a symlink), the file
0600, reused only when its bytes are exactly what this data writes, never written through a symlink, and
removed once the run committed (an interrupted run keeps it, and the same call resumes that run).

Every test runs the offline lexical judge. ``MINE``'s contexts support none of its references (every row scores
0.0); ``PLANTED`` has the same row ids and questions with contexts that repeat the references (1.0).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks import ConfigError, Evaluation, evaluate
from recall_tasks.pipeline import steps

REAL_SCORE_CHUNK = steps.score_chunk

REFERENCES = {
    "tea-1": "Green tea contains antioxidants that reduce inflammation.",
    "paris-1": "Paris is the capital of France.",
    "rome-1": "Rome was founded on seven hills.",
}
MINE = [
    {"row_id": rid, "input": f"Question {rid}?", "expected_output": ref, "retrieval_context": ["Bananas are yellow."]}
    for rid, ref in REFERENCES.items()
]
PLANTED = [{**row, "retrieval_context": [row["expected_output"]]} for row in MINE]


def scores(result: Evaluation) -> dict[str, float | None]:
    table = result.results
    return dict(zip(table.column("row_id").to_pylist(), table.column("score").to_pylist(), strict=True))


MINE_SCORES = dict.fromkeys(REFERENCES, 0.0)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own state directory, and its own system temporary folder (nothing planted in the real one)."""
    monkeypatch.setenv("RECALL_BENCH_STATE_DIR", str(tmp_path / "state"))
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))
    return tmp_path / "state"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def copies(state: Path) -> list[str]:
    folder = state / "inputs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def watch_the_run(monkeypatch: pytest.MonkeyPatch, seen: list[dict[str, Any]], fail: bool = False) -> None:
    """Record the inputs folder's and its files' modes while a chunk is scored; ``fail``: the chunk then raises."""
    real = steps.score_chunk

    def watched(plan: Any, *args: Any) -> Any:
        path = Path(plan.dataset.uri)
        folder = path.parent
        seen.append(
            {
                "path": path,
                "folder_mode": mode(folder),
                "folder_owner": os.lstat(folder).st_uid,
                "files": {p.name: (mode(p), os.lstat(p).st_uid) for p in folder.iterdir()},
            }
        )
        if fail:
            raise RuntimeError("interrupted by the test")
        return real(plan, *args)

    monkeypatch.setattr(steps, "score_chunk", watched)


def test_the_copy_is_private_while_the_run_needs_it_and_gone_once_it_committed(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    watch_the_run(monkeypatch, seen)
    result = evaluate(pa.Table.from_pylist(MINE))
    assert scores(result) == MINE_SCORES
    path = Path(result.run["dataset_uri"])
    assert path.parent == state / "inputs" and path.suffix == ".parquet"
    assert seen and {s["path"] for s in seen} == {path}
    assert {s["folder_mode"] for s in seen} == {0o700}
    assert {s["folder_owner"] for s in seen} == {os.geteuid()}
    assert seen[0]["files"] == {path.name: (0o600, os.geteuid())}
    assert copies(state) == []  # the run committed: its copy is removed
    assert not (Path(tempfile.gettempdir()) / "recall-bench-inputs").exists()  # nothing in the system temp


def old_shared_name(table: pa.Table) -> Path:
    """Where the previous code put (and reused) ``table``'s copy."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    digest = hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / "recall-bench-inputs" / f"{digest}.parquet"


def test_a_file_planted_at_the_old_shared_name_is_not_read(state: Path) -> None:
    mine = pa.Table.from_pylist(MINE)
    planted = old_shared_name(mine)
    planted.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(PLANTED), planted)
    before = planted.read_bytes()
    result = evaluate(mine)
    assert scores(result) == MINE_SCORES  # the old code scored the planted rows: 1.0 each
    assert Path(result.run["dataset_uri"]).parent == state / "inputs"
    assert planted.read_bytes() == before and os.listdir(planted.parent) == [planted.name]


def test_a_differing_file_at_the_copy_s_name_is_replaced_never_used(state: Path) -> None:
    first = evaluate(MINE)
    path = Path(first.run["dataset_uri"])
    assert scores(first) == MINE_SCORES and not path.exists()
    pq.write_table(pa.Table.from_pylist(PLANTED), path)  # other rows (1.0 each) under this data's name
    os.chmod(path, 0o600)
    again = evaluate(MINE)
    assert scores(again) == MINE_SCORES and again.run["dataset_uri"] == str(path)
    assert copies(state) == []


def test_a_symlink_at_the_copy_s_name_is_neither_read_nor_written_through(state: Path, tmp_path: Path) -> None:
    path = Path(evaluate(MINE).run["dataset_uri"])
    victim = tmp_path / "victim.parquet"  # someone else's file, holding other rows
    pq.write_table(pa.Table.from_pylist(PLANTED), victim)
    before = victim.read_bytes()
    path.symlink_to(victim)
    absent = tmp_path / "absent.parquet"
    assert scores(evaluate(MINE)) == MINE_SCORES
    assert victim.read_bytes() == before and not victim.is_symlink()
    path.symlink_to(absent)  # a dangling link: following it would create the file
    assert scores(evaluate(MINE)) == MINE_SCORES
    assert not absent.exists() and not os.path.lexists(path)


def test_the_inputs_folder_as_a_symlink_is_refused(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state.mkdir(mode=0o700)
    (state / "inputs").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"inputs.*is a symbolic link"):
        evaluate(MINE)
    assert list(elsewhere.iterdir()) == []


def test_an_inputs_folder_others_can_read_is_repaired_to_0700(
    state: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (state / "inputs").mkdir(parents=True)
    os.chmod(state / "inputs", 0o755)
    seen: list[dict[str, Any]] = []
    watch_the_run(monkeypatch, seen)
    with caplog.at_level(logging.WARNING):
        assert scores(evaluate(MINE)) == MINE_SCORES
    assert {s["folder_mode"] for s in seen} == {0o700}
    assert mode(state / "inputs") == 0o700
    assert any("0755" in r.getMessage() and "0700" in r.getMessage() for r in caplog.records)


def test_a_folder_someone_else_owns_is_refused(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (state / "inputs").mkdir(parents=True, mode=0o700)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)  # as another user sees our folder
    with pytest.raises(ConfigError, match=rf"{state / 'inputs'}.*owned by uid {real}"):
        evaluate(MINE)


def test_a_state_dir_others_can_write_is_repaired_when_ours_and_refused_when_not(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever may write the state directory can swap its ``inputs`` folder after the check: group/other write
    is removed when the directory is ours (a umask of 002 leaves it so), refused when it is someone else's
    (unless sticky, as /tmp is: then only the owner may rename or remove what is in it)."""
    state.mkdir(mode=0o700)
    os.chmod(state, 0o777)
    assert scores(evaluate(MINE)) == MINE_SCORES
    assert mode(state) == 0o755
    os.chmod(state, 0o777)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)  # as another user sees our folder
    with pytest.raises(ConfigError, match=rf"{state} \(the state directory\) is writable by others"):
        evaluate(MINE)
    assert mode(state) == 0o777
    os.chmod(state, 0o1777)
    monkeypatch.setattr(os, "geteuid", lambda: real)
    assert scores(evaluate(MINE)) == MINE_SCORES
    assert mode(state) == 0o1777


def test_an_interrupted_run_keeps_its_copy_and_the_same_call_resumes_it(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "recall-output"
    seen: list[dict[str, Any]] = []
    watch_the_run(monkeypatch, seen, fail=True)
    with caplog.at_level(logging.INFO, logger="recall_tasks.run"), pytest.raises(Exception, match="interrupted"):
        evaluate(MINE, output=out)
    (first,) = {s["path"] for s in seen}
    assert copies(state) == [first.name] and mode(first) == 0o600 and mode(first.parent) == 0o700
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run ")]
    assert started and "(resumed)" not in started[0]
    run_id = started[0].split()[1].rstrip(":")
    monkeypatch.setattr(steps, "score_chunk", REAL_SCORE_CHUNK)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="recall_tasks.run"):
        again = evaluate(MINE, output=out)
    assert any(r.getMessage().startswith(f"run {run_id} (resumed)") for r in caplog.records)
    assert again.run["run_id"] == run_id and again.run["status"] == "completed"
    assert scores(again) == MINE_SCORES
    assert again.run["dataset_uri"] == str(first) and copies(state) == []


def test_a_copy_two_runs_share_stays_until_the_last_one_committed(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``evaluate()`` of the same data at once (threads of a notebook, two processes): the one that commits
    first leaves the copy the other still reads; the last one removes it."""
    import threading

    inside, go_on = threading.Event(), threading.Event()

    def held(plan: Any, *args: Any) -> Any:
        if not inside.is_set():  # the first run's first chunk waits until the second run committed
            inside.set()
            assert go_on.wait(60)
        return REAL_SCORE_CHUNK(plan, *args)

    monkeypatch.setattr(steps, "score_chunk", held)
    first: list[Evaluation] = []
    thread = threading.Thread(target=lambda: first.append(evaluate(MINE)))
    thread.start()
    try:
        assert inside.wait(60)
        second = evaluate(MINE)
        path = Path(second.run["dataset_uri"])
        assert path.parent == state / "inputs"
        assert copies(state) == [path.name] and mode(path) == 0o600  # the first run still holds it
    finally:
        go_on.set()
        thread.join(60)
    assert scores(first[0]) == scores(second) == MINE_SCORES
    assert first[0].run["dataset_uri"] == str(path) and copies(state) == []
