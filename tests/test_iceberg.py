"""``--format iceberg``: the embedded SQLite catalog and SeaweedFS's Iceberg REST catalog (the session's S3 server
serves it, tests/s3_server.py), with the promises the Delta tables keep and every reader, compared with Delta."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.io.results import ChunkPart, ResultStore
from recall_tasks.io.storage import StorageConfig
from tests import judge_script
from tests.test_pipeline import KEY, expected, make_rows
from tests.test_tracking import degrade

CATALOG = "rbtest"


@pytest.fixture(params=["sqlite", "rest"])
def where(request, tmp_path, monkeypatch) -> dict[str, Any]:
    """An Iceberg output: local with the embedded SQLite catalog, or on S3 through the REST catalog."""
    if request.param == "sqlite":
        return {"out": str(tmp_path / "out"), "catalog": None, "namespace": None}
    server = request.getfixturevalue("s3_server")
    for k, v in {**server.env(), **server.iceberg_catalog_env(CATALOG)}.items():
        monkeypatch.setenv(k, v)
    bucket = server.make_bucket()
    return {"out": f"s3://{bucket}/out", "catalog": CATALOG, "namespace": f"t_{uuid.uuid4().hex[:12]}"}


def store_of(where: dict[str, Any]) -> ResultStore:
    return ResultStore(where["out"], StorageConfig.from_options(), "iceberg", where["catalog"], where["namespace"])


def chunk(store: ResultStore, key: str, run_id: str, extra: str) -> ChunkPart:
    path = store.chunk_path(key * 32, run_id)
    store.write_chunk(path, pa.table({"row_id": ["a", "b"], "score": [1.0, 0.5], extra: ["x", "y"]}))
    return ChunkPart(path)


def rows_by_run(store: ResultStore, table: str) -> dict[str, int]:
    ds = store.read_table(table)  # type: ignore[arg-type]
    assert ds is not None
    ids = ds.to_table(columns=["run_id"]).column(0).to_pylist()
    return {r: ids.count(r) for r in sorted(set(ids))}


def test_a_rerun_after_a_crash_between_commits_appends_nothing_twice(where):
    store = store_of(where)
    part = chunk(store, "a", "run-1", "team")
    # the state a crash after the results commit leaves: results committed, runs not
    store.iceberg.append(
        "results", lambda: store._run_batches("run-1", [part], "d", "2026-12-01"), "recall-bench-results-run-1",
        partition_by=["dataset", "run_date"],
    )  # fmt: skip
    assert store.read_table("runs") is None
    run_row = {"run_id": "run-1", "dataset": "d", "rows": 2}
    store.commit("run-1", "d", "2026-12-01", [part], [run_row])  # the rerun: same run id
    store.commit("run-1", "d", "2026-12-01", [part], [run_row])  # and once more
    fresh = store_of({**where, "catalog": None, "namespace": None})  # found through <output>/_warehouse.json
    assert rows_by_run(fresh, "results") == {"run-1": 2} and rows_by_run(fresh, "runs") == {"run-1": 1}
    table = fresh.iceberg.table("results")
    assert [s.summary.get("recall-bench.commit-id") for s in table.snapshots()] == ["recall-bench-results-run-1"]
    assert [f.name for f in table.spec().fields] == ["dataset", "run_date"]


@pytest.mark.concurrency
def test_concurrent_runs_of_two_datasets_both_commit_and_evolve_the_schema(where, monkeypatch, caplog):
    """Both writers load one table version and commit from it: the loser's commit fails and is retried."""
    from pyiceberg.table import Transaction

    store = store_of(where)
    parts = [chunk(store, str(n), f"run-{n}", extra) for n, extra in enumerate(("team", "owner", "region"))]

    def commit(n: int) -> None:
        store_of(where).commit(
            f"run-{n}", f"d{n}", "2026-12-01", [parts[n]], [{"run_id": f"run-{n}", "dataset": f"d{n}"}]
        )

    commit(0)
    barrier = threading.Barrier(2, timeout=30)
    real, calls = Transaction.commit_transaction, []

    def both_from_one_version(self: Any) -> Any:
        calls.append(1)
        if len(calls) <= 2:  # each writer's first commit waits for the other: both start from one version
            barrier.wait()
        return real(self)

    monkeypatch.setattr(Transaction, "commit_transaction", both_from_one_version)
    caplog.set_level("INFO", logger="recall_tasks.io.iceberg")
    errors: list[BaseException] = []

    def attempt(n: int) -> None:
        try:
            commit(n)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert "commit conflict" in caplog.text  # the retry path ran
    assert rows_by_run(store, "results") == {"run-0": 2, "run-1": 2, "run-2": 2}
    assert rows_by_run(store, "runs") == {"run-0": 1, "run-1": 1, "run-2": 1}
    results = store.read_table("results").to_table()
    assert {"team", "owner", "region"} <= set(results.column_names)
    assert sorted(v for v in results.column("owner").to_pylist() if v) == ["x", "y"]


@pytest.mark.concurrency
@pytest.mark.parametrize("where", ["sqlite"], indirect=True)  # the conflict itself is tested on REST above
def test_the_same_run_committed_by_two_writers_at_once_lands_once(where, monkeypatch, caplog):
    from pyiceberg.table import Transaction

    store = store_of(where)
    part = chunk(store, "c", "run-1", "team")
    store_of(where).commit("run-0", "d", "2026-12-01", [chunk(store, "d", "run-0", "team")], [{"run_id": "run-0"}])
    barrier = threading.Barrier(2, timeout=30)
    real = Transaction.commit_transaction
    waited: list[int] = []

    def after_both_checked(self: Any) -> Any:
        if len(waited) < 2:
            waited.append(1)
            barrier.wait()
        return real(self)

    monkeypatch.setattr(Transaction, "commit_transaction", after_both_checked)
    caplog.set_level("INFO", logger="recall_tasks.io.iceberg")
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            store_of(where).commit("run-1", "d", "2026-12-01", [part], [{"run_id": "run-1", "dataset": "d"}])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert "committed by a concurrent writer" in caplog.text
    assert rows_by_run(store, "results") == {"run-0": 2, "run-1": 2}
    assert rows_by_run(store, "runs") == {"run-0": 1, "run-1": 1}


def test_an_output_keeps_its_catalog(tmp_path, s3_server, monkeypatch):
    out = str(tmp_path / "out")
    store = ResultStore(out, StorageConfig.from_options(), "iceberg", None, "nightly")
    store.commit("run-0", "d", "2026-12-01", [chunk(store, "e", "run-0", "team")], [{"run_id": "run-0"}])
    assert json.loads((tmp_path / "out" / "_warehouse.json").read_text()) == {
        "format": "iceberg", "catalog": None, "namespace": "nightly"
    }  # fmt: skip
    other = ResultStore(out, StorageConfig.from_options(), "iceberg", None, "other")
    with pytest.raises(Exception, match="holds the Iceberg tables of catalog .embedded SQLite., namespace nightly"):
        other.read_table("runs")
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    missing = ResultStore(f"s3://{s3_server.make_bucket()}/out", StorageConfig.from_options(), "iceberg")
    with pytest.raises(Exception, match="needs --catalog NAME"):
        missing.read_table("runs")
    unknown = ResultStore(str(tmp_path / "new"), StorageConfig.from_options(), "iceberg", "nosuch")
    with pytest.raises(Exception, match="--catalog nosuch: no such pyiceberg catalog"):
        unknown.read_table("runs")


# -------------------------------------------------------------------------- done means: the CLI, both formats


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def write(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def two_nights(out: str, data: list[str], base_url: str, *extra: str) -> list[Any]:
    common = ["--judge", "openai", "--base-url", base_url, "--chunk-size", "10", "--segment-by", "category"]
    return [cli("run", d, "-o", out, "--dataset-name", "golden", *common, *extra) for d in data]


def verdicts_of(store: ResultStore) -> dict[tuple[int, str], Any]:
    """Each run's rows by (night, row id): score and verdicts (run ids differ between outputs)."""
    runs = store.read_table("runs").to_table().sort_by("started_at").to_pylist()
    order = {run_id: n for n, run_id in enumerate(dict.fromkeys(r["run_id"] for r in runs))}
    rows = store.read_table("results").to_table(columns=["run_id", "row_id", "score", "verdicts", "category"])
    return {(order[r["run_id"]], r["row_id"]): (r["score"], r["verdicts"], r["category"]) for r in rows.to_pylist()}


def test_two_nights_on_iceberg_give_the_tables_verdicts_and_reports_of_delta(
    prefect_harness, fake_openai, monkeypatch, tmp_path, where
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    fake_openai.set_responder(judge_script.responder)
    rows = make_rows(30, seed=21)
    data = [write(tmp_path / "n1" / "eval.parquet", rows), write(tmp_path / "n2" / "eval.parquet", degrade(rows, 4))]
    delta = str(tmp_path / "delta")
    for got in two_nights(delta, data, fake_openai.base_url, "--format", "delta"):
        assert got.exit_code in (0, 3), got.output
    fake_openai.reset()
    fake_openai.set_responder(judge_script.responder)
    ice = ["--format", "iceberg"]
    ice += ["--catalog", where["catalog"], "--namespace", where["namespace"]] if where["catalog"] else []
    nights = two_nights(where["out"], data, fake_openai.base_url, *ice)
    assert [n.exit_code for n in nights] == [0, 0], nights[-1].output
    assert "regressed" in nights[1].output

    d_store, i_store = ResultStore(delta, StorageConfig.from_options()), store_of(where)
    d_verdicts, i_verdicts = verdicts_of(d_store), verdicts_of(i_store)
    assert i_verdicts == d_verdicts and len(i_verdicts) == 60
    assert all(score == pytest.approx(expected(r)) for r in rows for score, *_ in [i_verdicts[(0, r["row_id"])]])
    assert i_store.read_table("results").schema == d_store.read_table("results").schema  # the same columns
    for name in ("runs", "comparisons"):
        d_schema, i_schema = d_store.read_table(name).schema, i_store.read_table(name).schema  # type: ignore[arg-type]
        assert [(f.name, f.type) for f in i_schema] == [(f.name, f.type) for f in d_schema], name

    # every reader finds the tables from --output alone (no --format, no --catalog)
    history = [
        json.loads(line) for line in cli("history", "-o", where["out"], "--output-format", "json").stdout.splitlines()
    ]
    d_history = [
        json.loads(line) for line in cli("history", "-o", delta, "--output-format", "json").stdout.splitlines()
    ]
    drop = {"run_id", "started_at", "finished_at", "baseline_run_id", "wall_seconds"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in history] == [
        {k: v for k, v in r.items() if k not in drop} for r in d_history
    ]
    assert [r["verdict"] for r in history] == [None, "regressed"]
    sql = "SELECT run_id, count(*) AS n, count(DISTINCT row_id) AS d FROM results GROUP BY run_id ORDER BY run_id"
    answer = cli("query", sql, "-o", where["out"], "--output-format", "json")
    assert answer.exit_code == 0, answer.output
    counts = [json.loads(line) for line in answer.stdout.splitlines()]
    assert sorted(r["run_id"] for r in counts) == sorted({r["run_id"] for r in history})
    assert all(r["n"] == r["d"] == 30 for r in counts)

    # read back through pyiceberg itself: both runs' rows exactly once
    scanned = i_store.iceberg.table("results").scan(selected_fields=("run_id", "row_id")).to_arrow().to_pylist()
    assert len(scanned) == len({(r["run_id"], r["row_id"]) for r in scanned}) == 60

    last = history[-1]["run_id"]
    report = cli("report", last, "-o", where["out"], "--to", str(tmp_path / "report.html"))
    assert report.exit_code == 0, report.output
    html = (tmp_path / "report.html").read_text()
    assert "regressed" in html and "trend" in html.lower()

    # no credential anywhere the output or the catalog keeps
    secret = StorageConfig.from_options().secrets()
    marker = i_store.fs.cat_file(f"{i_store.root}/_warehouse.json").decode()
    kept = [marker] + [json.dumps(s.summary.model_dump(mode="json")) for s in i_store.iceberg.table("runs").snapshots()]
    kept += [json.dumps(i_store.iceberg.table(n).properties) for n in ("results", "runs", "comparisons")]
    assert not any(s and s in text for s in secret for text in kept)


@pytest.mark.parametrize(
    "marker",
    ['{"format": "iceberg", "catalog": null, "namespace": "a."}', "{not json"],
    ids=["namespace-a-dot", "not-json"],
)
def test_a_broken_warehouse_marker_is_one_error_line_on_every_command(prefect_harness, tmp_path, marker):
    """``_warehouse.json`` as a run with ``--namespace 'a.'`` left it before the namespace was checked (or any
    unreadable one): every command that opens the output says so in one ``error:`` line naming the file, exit 2;
    ``maintain`` ended with a ValueError traceback, ``history`` with a storage error."""
    out = tmp_path / "out"
    store = ResultStore(str(out), StorageConfig.from_options(), "iceberg", None, "nightly")
    store.commit("run-0", "d", "2026-12-01", [chunk(store, "e", "run-0", "team")], [{"run_id": "run-0"}])
    (out / "_warehouse.json").write_text(marker, encoding="utf-8")
    data = write(tmp_path / "data" / "eval.parquet", make_rows(4))
    commands = {
        "history": ["history", "-o", str(out)],
        "query": ["query", "SELECT count(*) FROM runs", "-o", str(out)],
        "report": ["report", "run-0", "-o", str(out)],
        "maintain": ["maintain", "-o", str(out)],
        "run": ["run", data, "-o", str(out)],
        "dry-run": ["run", data, "-o", str(out), "--dry-run"],
    }
    for name, argv in commands.items():
        result = cli(*argv)
        assert result.exit_code == 2, (name, result.exit_code, result.output, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.exception)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"{out}/_warehouse.json: " in errors[0], (name, result.output)
    assert (out / "_warehouse.json").read_text(encoding="utf-8") == marker  # nothing rewrote it
