"""One table backend per format behind ``ResultStore`` (``recall_tasks/io/tables.py``, issue 40 item 4): the shared
commit-retry and batching helpers, the Parquet layout they write, the conditional write the run lease and the
``--batch`` record share, and what is left of the per-format switches."""

from __future__ import annotations

import ast
import errno
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recall_tasks.io import conditional
from recall_tasks.io.results import BACKENDS, FORMATS, ChunkPart, ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.io.tables import BATCH_ROWS, retry_commits, row_groups
from recall_tasks.pipeline.batch import record

PACKAGE = Path(__file__).resolve().parents[1] / "recall_tasks"


class Lost(Exception):
    """A commit conflict (another writer committed first)."""


class GaveUp(Exception):
    pass


def conflicting(times: int, calls: list[int]):
    """An attempt that loses ``times`` races, then commits (returns the attempt number)."""

    def attempt(n: int) -> int:
        calls.append(n)
        if n < times:
            raise Lost(f"conflict {n}")
        return n

    return attempt


@pytest.mark.parametrize("limit", [4, 5, 6])
def test_a_commit_is_tried_at_most_its_limit_then_the_conflict_is_raised(limit: int) -> None:
    calls: list[int] = []
    with pytest.raises(Lost, match=f"conflict {limit - 1}"):
        retry_commits("t", conflicting(100, calls), attempts=limit, conflicts=(Lost,))
    assert calls == list(range(limit))
    calls.clear()
    assert retry_commits("t", conflicting(limit - 1, calls), attempts=limit, conflicts=(Lost,)) == limit - 1


def test_give_up_replaces_the_last_conflict_and_keeps_it_as_the_cause() -> None:
    with pytest.raises(GaveUp) as caught:
        retry_commits("t", conflicting(9, []), attempts=2, conflicts=(Lost,), give_up=lambda e: GaveUp(str(e)))
    assert isinstance(caught.value.__cause__, Lost)


def test_a_commit_found_landed_after_a_conflict_is_not_tried_again() -> None:
    calls: list[int] = []
    asked: list[int] = []

    def landed() -> bool:
        asked.append(1)
        return len(asked) == 2  # the second conflict turns out to be our own commit, made by another writer

    assert retry_commits("t", conflicting(9, calls), attempts=4, conflicts=(Lost,), landed=landed) is None
    assert calls == [0, 1]
    # asked after the last conflict too: a commit that landed is never reported as lost
    asked.clear()
    assert retry_commits("t", conflicting(9, []), attempts=1, conflicts=(Lost,), landed=lambda: True) is None


def test_another_error_is_not_retried() -> None:
    calls: list[int] = []

    def attempt(n: int) -> None:
        calls.append(n)
        raise ValueError("not a conflict")

    with pytest.raises(ValueError, match="not a conflict"):
        retry_commits("t", attempt, attempts=5, conflicts=(Lost,))
    assert calls == [0]


def test_rows_leave_in_tables_of_250k_rows_in_order() -> None:
    schema = pa.schema([pa.field("i", pa.int64())])
    batches = [
        pa.record_batch([pa.array(range(s, s + 100_000), pa.int64())], schema=schema)
        for s in range(0, 500_000, 100_000)
    ]
    groups = list(row_groups(batches, schema))
    assert BATCH_ROWS == 250_000
    assert [g.num_rows for g in groups] == [300_000, 200_000]  # a table closes once it holds 250k rows or more
    assert pa.concat_tables(groups).column("i").to_pylist() == list(range(500_000))
    assert list(row_groups([], schema)) == []


def test_a_parquet_run_is_written_in_files_of_250k_rows_and_read_once_committed(tmp_path: Path) -> None:
    store = ResultStore(str(tmp_path / "out"), StorageConfig.from_options(), "parquet")
    chunk = store.chunk_path("ab" + "0" * 62, "run-1")
    store.write_chunk(chunk, pa.table({"row_id": [f"r{i}" for i in range(300_000)]}))
    store.commit("run-1", "d", "2026-12-04", [ChunkPart(chunk)], [{"run_id": "run-1", "dataset": "d"}], label="x")
    folder = tmp_path / "out" / "results" / "dataset=d" / "run_date=2026-12-04"
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["run-1-part-00000.parquet", "run-1-part-00001.parquet"]
    # chunk rows are read in batches of 65536: a file closes at the first batch that reaches 250k rows
    assert [pq.read_metadata(folder / f).num_rows for f in files] == [4 * 65_536, 300_000 - 4 * 65_536]
    assert "dataset" not in pq.read_schema(folder / files[0]).names  # the partition is the folder
    assert (tmp_path / "out" / "runs" / "dataset=d" / "run-1.parquet").exists()
    results = store.read_table("results")
    assert results is not None
    table = results.to_table(columns=["run_id", "label"])
    assert table.num_rows == 300_000 and set(table.column("label").to_pylist()) == {"x"}
    stray = pq.read_table(folder / files[1])  # a run that wrote its rows but not its runs file: not committed
    stray = stray.set_column(stray.column_names.index("run_id"), "run_id", pa.array(["run-2"] * stray.num_rows))
    pq.write_table(stray, folder / "run-2-part-00000.parquet")
    again = store.read_table("results")
    assert again is not None and set(again.to_table(columns=["run_id"]).column(0).to_pylist()) == {"run-1"}


def test_every_format_has_a_backend() -> None:
    assert set(BACKENDS) == set(FORMATS)
    for fmt in ("delta", "parquet"):
        backend = ResultStore("/tmp/unused-output", StorageConfig.from_options(), fmt).backend  # type: ignore[arg-type]
        assert {"append", "read", "maintain"} <= set(dir(backend))


def _compares_format(path: Path) -> list[int]:
    """Lines of ``path`` testing a ``format`` attribute for one value (``store.format == "delta"``: an if/elif on
    the table format)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr == "format"
            and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
        ):
            found.append(node.lineno)
    return found


def test_results_and_maintenance_no_longer_switch_on_the_format() -> None:
    assert _compares_format(PACKAGE / "io" / "results.py") == []
    assert _compares_format(PACKAGE / "io" / "maintenance.py") == []


def test_no_module_but_results_uses_the_stores_private_path() -> None:
    users = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "results.py" or p.parent.name != "io"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "._path(" in line and "store" in line
    ]
    assert users == []


@pytest.mark.parametrize("folder", ["io", "analysis"])
def test_the_modules_of_io_and_analysis_stay_under_400_lines(folder: str) -> None:
    long = {p.name: n for p in (PACKAGE / folder).glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


@pytest.mark.parametrize("protocol", ["file", "memory"])
def test_the_batch_record_is_written_by_the_one_conditional_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """Locally under the folder's lock; on a store without conditional requests (memory) the same compare in two
    steps, said once in a warning (the record used to be written there unconditionally)."""
    import fsspec

    monkeypatch.setattr(conditional, "_warned", set())
    caplog.set_level(logging.WARNING, logger="recall_tasks.io.conditional")
    fs = fsspec.filesystem(protocol)
    path = str(tmp_path / "_batches" / "k.json")
    assert record.read_at(fs, path) is None
    first = record.Record({"n": 1})
    record.save(fs, path, first)
    assert record.read_at(fs, path) == {"n": 1} and first.token is not None
    got = conditional.read(fs, path)
    assert got is not None and got[1] == first.token  # one version for the record and the primitive
    conditional.write(fs, path, b'{"n": 2}', got[1])  # another writer
    with pytest.raises(record.RecordChanged):
        record.save(fs, path, record.Record({"n": 3}))  # a new record over an existing one
    first["n"] = 3
    with pytest.raises(record.RecordChanged):
        record.save(fs, path, first)  # the version it was read at is gone
    with pytest.raises(conditional.Conflict):
        conditional.write(fs, path, b"{}", None)  # a create over an existing object
    assert record.read_at(fs, path) == {"n": 2}
    warned = [r.getMessage() for r in caplog.records if "no conditional write" in r.getMessage()]
    assert len(warned) == (protocol == "memory")


def test_a_refused_s3_precondition_is_a_conflict_however_s3fs_wraps_it() -> None:
    class ClientError(Exception):
        response = {"Error": {"Code": "PreconditionFailed"}, "ResponseMetadata": {"HTTPStatusCode": 412}}

    wrapped = OSError(errno.EINVAL, "At least one of the pre-conditions you specified did not hold")
    wrapped.__cause__ = ClientError()
    assert conditional.precondition_failed(wrapped)
    assert conditional.precondition_failed(OSError(errno.EINVAL, "pre-condition failed"))
    assert not conditional.precondition_failed(OSError(errno.EACCES, "access denied"))
