"""``results.label``: each result row carries its run's ``--label`` (filter by label without a join to ``runs``).

The column came after the table's first release: an output written before it (its results table without the
column) takes a new run's rows with the column added, and its older rows read null, in every format. The "old"
tables here are a real run's rewritten without the column (Delta overwritten with the older schema, the Iceberg
table dropped and written again without it, Parquet files rewritten without it).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recall_tasks.cli.app import app
from recall_tasks.config import RunParams
from recall_tasks.io.results import ResultStore
from recall_tasks.io.storage import StorageConfig
from recall_tasks.pipeline.flow import recall_benchmark
from tests.test_pipeline import make_rows


def without_label(store: ResultStore, fmt: str) -> None:
    """Turn the output's results table into one written before ``results.label`` existed."""
    if fmt == "delta":
        from deltalake import DeltaTable, write_deltalake

        old = DeltaTable(store.results_uri).to_pyarrow_table().drop_columns(["label"])
        write_deltalake(store.results_uri, old, mode="overwrite", schema_mode="overwrite",
                        partition_by=["dataset", "run_date"])  # fmt: skip
    elif fmt == "iceberg":  # a table created and written without the column, through the store's own commit path
        old = store.iceberg.table("results").scan().to_arrow().drop_columns(["label"])
        store.iceberg.catalog.drop_table(store.iceberg.identifier("results"))
        run_id = old.column("run_id")[0].as_py()
        store.iceberg.append("results", lambda: old, f"old-{run_id}", ["dataset", "run_date"], ("run_id", run_id))
    else:
        for path in store.fs.find(store.path("results")):
            pq.write_table(pq.read_table(path, filesystem=store.fs).drop_columns(["label"]), path, filesystem=store.fs)
            assert "label" not in pq.read_schema(path, filesystem=store.fs).names
        return  # the reader adds the column itself (null in such files): what this test checks below
    assert "label" not in store.read_table("results").schema.names


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "parquet"])
def test_results_carry_the_run_label_and_older_tables_evolve(prefect_harness, tmp_path, fmt):
    rows = make_rows(8, seed=5)
    for i, row in enumerate(rows):
        row["label"] = f"human-{i % 2}"  # a pass-through column named label: kept, as data_label
    data = tmp_path / "data" / "eval.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = str(tmp_path / "out")
    common = {"dataset_uri": str(data), "output_uri": out, "judge": "lexical", "format": fmt, "baseline": None}
    first = recall_benchmark(RunParams(**common, label="old"))
    store = ResultStore(out, StorageConfig.from_options(), fmt)
    names = store.read_table("results").schema.names
    assert "label" in names and "data_label" in names
    if fmt != "parquet":  # Parquet's partition columns come after the files' own
        assert names[-1] == "label"
    without_label(store, fmt)

    second = recall_benchmark(RunParams(**common, label="index-v2"))
    third = recall_benchmark(RunParams(**common))  # no --label: null
    sql = ("SELECT run_id, label, count(*) AS n, count(DISTINCT data_label) AS kept FROM results "
           "GROUP BY ALL ORDER BY run_id")  # fmt: skip
    answer = CliRunner().invoke(app, ["query", sql, "--output", out, "--output-format", "json"])
    assert answer.exit_code == 0, answer.output
    got = [json.loads(line) for line in answer.stdout.splitlines()]
    expected = [
        {"run_id": first["run_id"], "label": None, "n": 8, "kept": 2},  # written before the column: null
        {"run_id": second["run_id"], "label": "index-v2", "n": 8, "kept": 2},
        {"run_id": third["run_id"], "label": None, "n": 8, "kept": 2},
    ]
    # run ids of the same second are ordered by their random suffix, not by time
    assert got == sorted(expected, key=lambda r: r["run_id"])
    by_label = CliRunner().invoke(
        app, ["query", "SELECT count(*) AS n FROM results WHERE label = 'index-v2'", "--output", out,
              "--output-format", "json"],
    )  # fmt: skip
    assert json.loads(by_label.stdout) == {"n": 8}
